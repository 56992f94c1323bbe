package bridge

import (
	"bytes"
	"strings"
	"testing"

	"github.com/mdproxy/mdproxy/internal/redistest"
)

// paddedFinal is a final result of dataID of size bytes (a pad field makes up the
// size; at least 200).
func paddedFinal(dataID string, size int) []byte {
	head := `{"data_id":"` + dataID + `","scan_results":{"scan_all_result_i":0,"progress_percentage":100},"process_info":{"progress_percentage":100},"pad":"`
	return []byte(head + strings.Repeat("x", size-len(head)-2) + `"}`)
}

// newBudgetStore returns a RedisStore on srv whose look-ups are charged to answers.
func newBudgetStore(t *testing.T, srv *redistest.Server, answers *Budget) *RedisStore {
	t.Helper()
	s, err := NewRedisStore(srv.Client(t), RedisStoreOptions{TTL: testTTL, PendingTTL: testPendingTTL,
		Timeout: testTimeout, MaxBytes: testMaxBytes, Answers: answers})
	if err != nil {
		t.Fatalf("NewRedisStore = %v, want no error", err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestRedisStoreLookupBudget: the copies of results that look-ups read from Redis for
// their owner hold bytes of the answer budget, exactly their bodies', until released;
// a look-up the budget cannot take reads no body and says Withheld. Bodies larger than
// what the first call reads (inlineBody) and smaller ones alike; another owner's look-up
// and a miss take nothing.
func TestRedisStoreLookupBudget(t *testing.T) {
	srv := redistest.Start(t)
	big := paddedFinal("big", 3*inlineBody) // read in a second call
	small := finalResult("small")
	answers := NewBudget(3*int64(len(big)) + inlineBody/2)
	s := newBudgetStore(t, srv, answers)
	s.Put("big", Result{Body: big, ContentType: jsonType, Owner: alice})
	s.Put("small", Result{Body: small, ContentType: jsonType, Owner: alice})

	var held []Entry
	for i := 1; i <= 5; i++ {
		e := s.Lookup("big", alice)
		switch {
		case i <= 3:
			if !e.Stored || e.Withheld || !bytes.Equal(e.Result.Body, big) || e.Release == nil {
				t.Fatalf("look-up #%d of a result the budget can hold = stored %v, withheld %v, %d bytes, release %v; want its %d bytes and a Release",
					i, e.Stored, e.Withheld, len(e.Result.Body), e.Release != nil, len(big))
			}
			held = append(held, e)
		default:
			if !e.Stored || !e.Withheld || e.Result.Owner != alice || e.Result.Body != nil || e.Release != nil {
				t.Errorf("look-up #%d with the budget full = stored %v, withheld %v, owner alice %v, %d bytes, release %v; want alice's result withheld, no body",
					i, e.Stored, e.Withheld, e.Result.Owner == alice, len(e.Result.Body), e.Release != nil)
			}
		}
		if got, want := answers.Held(), int64(len(held)*len(big)); got != want {
			t.Fatalf("after look-up #%d the budget holds %d bytes, want %d (%d copies held)", i, got, want, len(held))
		}
	}

	// Less free than the first call reads at once, enough for a small body: read.
	if free := answers.Max() - answers.Held(); free >= inlineBody || free < int64(len(small)) {
		t.Fatalf("the test's budget leaves %d bytes free, want fewer than %d and at least %d", free, inlineBody, len(small))
	}
	e := s.Lookup("small", alice)
	if e.Withheld || !bytes.Equal(e.Result.Body, small) {
		t.Errorf("look-up of a small result with %d bytes free = withheld %v, %q; want its body", answers.Max()-answers.Held(), e.Withheld, e.Result.Body)
	}
	if got, want := answers.Held(), int64(3*len(big)+len(small)); got != want {
		t.Errorf("with the small copy the budget holds %d bytes, want %d", got, want)
	}
	e.Release()
	e.Release() // once only
	for _, e := range held {
		e.Release()
	}
	if got := answers.Held(); got != 0 {
		t.Fatalf("all copies released, the budget holds %d bytes, want 0", got)
	}

	// Another owner learns whose result it is, and a miss learns nothing: neither
	// holds the budget.
	if e := s.Lookup("big", bob); !e.Stored || e.Withheld || e.Result.Body != nil || e.Release != nil || answers.Held() != 0 {
		t.Errorf("bob's look-up = stored %v, withheld %v, %d bytes, release %v, budget %d; want alice's result named, nothing held",
			e.Stored, e.Withheld, len(e.Result.Body), e.Release != nil, answers.Held())
	}
	if e := s.Lookup("none", alice); e.Stored || e.Release != nil || answers.Held() != 0 {
		t.Errorf("look-up of a miss = %+v, budget %d; want nothing held", e, answers.Held())
	}
}

// TestPollWithheldAskedOfCore: a poll of the owner's stored result that the answer
// budget cannot copy now is Overdue with the in-progress answer (Core is asked under
// the route's limit, and a refusal answers "in progress", never a 503); once the budget
// is free it is answered from the store, and the answer's Release gives the bytes back.
func TestPollWithheldAskedOfCore(t *testing.T) {
	srv := redistest.Start(t)
	body := paddedFinal("r1", 4096)
	answers := NewBudget(int64(len(body)))
	b, err := New(Options{CallbackURL: "http://127.0.0.1:9010", Store: newBudgetStore(t, srv, answers)})
	if err != nil {
		t.Fatal(err)
	}
	b.store.Put("r1", Result{Body: body, ContentType: jsonType, Owner: alice})

	first := b.Poll("r1", alice)
	if first.Source != Stored || !bytes.Equal(first.Body, body) || first.Release == nil {
		t.Fatalf("first poll = %v, %d bytes, release %v; want the stored result and a Release", first.Source, len(first.Body), first.Release != nil)
	}
	second := b.Poll("r1", alice)
	if second.Source != Overdue || !bytes.Equal(second.Body, InProgress("r1")) || second.Release != nil {
		t.Errorf("poll while the first copy is held = %v, %q; want Overdue with the in-progress answer", second.Source, second.Body)
	}
	checkSchema(t, "the withheld poll's answer", second.Body)
	first.Release()
	third := b.Poll("r1", alice)
	if third.Source != Stored || !bytes.Equal(third.Body, body) {
		t.Errorf("poll once the copy was released = %v, %d bytes; want the stored result", third.Source, len(third.Body))
	}
	third.Release()
	if answers.Held() != 0 {
		t.Errorf("the budget holds %d bytes after every answer was released, want 0", answers.Held())
	}
}
