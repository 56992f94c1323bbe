package bench

// SeedTable is the published benchmark's table: OPSWAT's measurement of MetaDefender
// Core 5.13.0 on 8 vCPU, cited in bench/PUBLISHED.md (source, machine, workload). It is
// what mdbench prints beside its own figures; testdata/published.csv holds the same
// table in CSV for LoadPublished, and a test checks that the two agree.
func SeedTable() map[string]Published {
	f := func(v float64) *float64 { return &v }
	rows := []Published{
		{Case: "No-limit", DurationMin: 45.2, ProcessedFilesPerHour: 173895, FetchRequestsPerS: f(51.002), FetchErrorRatePct: f(0)},
		{Case: "Rate-50", LimitPerS: 50, DurationMin: 41.2, ProcessedFilesPerHour: 190822, FetchRequestsPerS: f(35.897), FetchErrorRatePct: f(10.503)},
		{Case: "Rate-20", LimitPerS: 20, DurationMin: 31.2, ProcessedFilesPerHour: 251536, FetchRequestsPerS: f(11.038), FetchErrorRatePct: f(93.157)},
		{Case: "Rate-10", LimitPerS: 10, DurationMin: 28.6, ProcessedFilesPerHour: 274913, FetchRequestsPerS: f(6.141), FetchErrorRatePct: f(96.763)},
		{Case: "Rate-1", LimitPerS: 1, DurationMin: 27.7, ProcessedFilesPerHour: 283113, FetchRequestsPerS: f(0.799), FetchErrorRatePct: f(99.84)},
		{Case: "Webhook", DurationMin: 26.9, ProcessedFilesPerHour: 292389},
	}
	out := map[string]Published{}
	for _, r := range rows {
		out[r.Case] = r
	}
	return out
}
