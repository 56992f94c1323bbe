package limiter

// Waiting returns how many requests wait in b's queue, for tests that must order
// arrivals behind a waiting request.
func (b *Bucket) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.waiting)
}
