package quota

// DefaultPolicies is the policy set `sluice serve` starts with when given
// no --policies file. All are enforced (not shadow), so the first request
// of the README shows a limit at work:
//
//   - anonymous-per-ip: tier "anonymous" (no registered key), token bucket
//     5/s, burst 10, counted per IPv4 address or IPv6 /64.
//   - free-default: tier "free", token bucket 10/s, burst 20.
//   - free-daily: tier "free", fixed window of 10 000 per UTC day.
//   - pro-default: tier "pro", routes /v1/*, token bucket 100/s, burst 200;
//     POST /v1/exports costs 10.
//   - login: every tier, POST to /login and /v1/login, sliding window
//     counter of 5 per 15 minutes, class security (never in headers, fails
//     closed).
//
// It returns a new slice each time; the policies are normalized and valid.
func DefaultPolicies() []Policy {
	ps := []Policy{
		{
			ID: "anonymous-per-ip", Match: Match{Tier: TierAnonymous},
			Algorithm: "token_bucket", RatePerSec: 5, Burst: 10, Mode: ModeEnforce,
			Description: "Requests without a registered API key, per IPv4 address or IPv6 /64.",
		},
		{
			ID: "free-default", Match: Match{Tier: "free"},
			Algorithm: "token_bucket", RatePerSec: 10, Burst: 20, Mode: ModeEnforce,
			Description: "Free tier, per key, all routes.",
		},
		{
			ID: "free-daily", Match: Match{Tier: "free"},
			Algorithm: "fixed_window", Count: 10000, Window: 86400, Mode: ModeEnforce,
			Description: "Free tier, per key, 10 000 requests per UTC day.",
		},
		{
			ID: "pro-default", Match: Match{Tier: "pro", Routes: []string{"/v1/*"}},
			Algorithm: "token_bucket", RatePerSec: 100, Burst: 200, Mode: ModeEnforce,
			Cost:        map[string]int64{"POST /v1/exports": 10},
			Description: "Pro tier, per key, the v1 API; exports cost 10.",
		},
		{
			ID: "login", Match: Match{Routes: []string{"/login", "/v1/login"}, Methods: []string{"POST"}},
			Algorithm: "sliding_window_counter", Count: 5, Window: 900, Class: ClassSecurity, Mode: ModeEnforce,
			Description: "Login attempts: 5 per 15 minutes per subject; fails closed, never in headers.",
		},
	}
	for i := range ps {
		ps[i] = ps[i].Normalize()
	}
	return ps
}
