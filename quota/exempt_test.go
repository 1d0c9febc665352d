package quota

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"
)

func problemFields(err error) []string {
	var ve *ValidationError
	if !errors.As(err, &ve) {
		return nil
	}
	var out []string
	for _, p := range ve.Problems {
		out = append(out, p.Field)
	}
	return out
}

func TestParseOverrideUnlimited(t *testing.T) {
	const exp = `"expires_at":"2999-01-01T00:00:00Z"`
	tests := []struct {
		name, doc string
		fields    []string // nil: accepted
	}{
		{"exemption", `{"id":"x","subject":"user:1","policy":"p","unlimited":true,` + exp + `}`, nil},
		{"with limit", `{"id":"x","subject":"user:1","policy":"p","unlimited":true,"limit":5,` + exp + `}`, []string{"limit"}},
		{"with rate", `{"id":"x","subject":"user:1","policy":"p","unlimited":true,"rate_per_sec":5,` + exp + `}`, []string{"rate_per_sec"}},
		{"with burst and window", `{"id":"x","subject":"user:1","policy":"p","unlimited":true,"burst":5,"window":60,` + exp + `}`, []string{"burst", "window"}},
		{"no expiry", `{"id":"x","subject":"user:1","policy":"p","unlimited":true}`, []string{"expires_at"}},
		{"false is an ordinary override", `{"id":"x","subject":"user:1","policy":"p","unlimited":false,` + exp + `}`, []string{""}},
		{"not a bool", `{"id":"x","subject":"user:1","policy":"p","unlimited":"yes",` + exp + `}`, []string{"unlimited"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := ParseOverride([]byte(tt.doc))
			if tt.fields == nil {
				if err != nil || !o.Unlimited {
					t.Fatalf("ParseOverride(%s) = %+v, %v, want an exemption", tt.doc, o, err)
				}
				return
			}
			if got := problemFields(err); !reflect.DeepEqual(got, tt.fields) {
				t.Errorf("ParseOverride(%s) = %v, want problems on %q", tt.doc, err, tt.fields)
			}
		})
	}
}

func TestPutOverrideUnlimitedValidation(t *testing.T) {
	ctx := t.Context()
	clk := newFakeClock()
	r := NewRegistry(RegistryConfig{Clock: clk})
	mustPut(t, r, tb("free", "free", 10, 20))
	mustPut(t, r, Policy{ID: "login", Match: Match{Routes: []string{"/login"}}, Algorithm: "sliding_window_counter", Count: 5, Window: 900, Class: ClassSecurity})
	if _, err := r.PutOverride(ctx, "ops", Override{ID: "raise", Subject: "user:9", Policy: "free", Burst: 50, ExpiresAt: clk.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	in := clk.Now().Add(time.Hour)
	tests := []struct {
		name  string
		o     Override
		field string // "-": accepted
	}{
		{"exemption", Override{ID: "x", Subject: "user:1", Policy: "free", Unlimited: true, ExpiresAt: in}, "-"},
		{"security policy", Override{ID: "y", Subject: "user:1", Policy: "login", Unlimited: true, ExpiresAt: in}, "unlimited"},
		{"with a limit field", Override{ID: "y", Subject: "user:2", Policy: "free", Unlimited: true, Burst: 100, ExpiresAt: in}, "burst"},
		{"expiry required", Override{ID: "y", Subject: "user:2", Policy: "free", Unlimited: true}, "expires_at"},
		{"expiry in the past", Override{ID: "y", Subject: "user:2", Policy: "free", Unlimited: true, ExpiresAt: clk.Now()}, "expires_at"},
		{"unknown policy", Override{ID: "y", Subject: "user:2", Policy: "nope", Unlimited: true, ExpiresAt: in}, "policy"},
		{"subject already overridden", Override{ID: "y", Subject: "user:9", Policy: "free", Unlimited: true, ExpiresAt: in}, "subject"},
		{"raising a security limit is still allowed", Override{ID: "z", Subject: "user:1", Policy: "login", Count: 50, ExpiresAt: in}, "-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := r.PutOverride(ctx, "ops", tt.o)
			if tt.field == "-" {
				if err != nil {
					t.Fatalf("PutOverride(%+v) = %v, want accepted", tt.o, err)
				}
				return
			}
			if !slices.Contains(problemFields(err), tt.field) {
				t.Errorf("PutOverride(%+v) = %v, want a problem on %q", tt.o, err, tt.field)
			}
		})
	}
}

func TestMatchExempt(t *testing.T) {
	ctx := t.Context()
	clk := newFakeClock()
	r := NewRegistry(RegistryConfig{Clock: clk})
	mustPut(t, r, tb("all", "", 100, 100))
	mustPut(t, r, tb("free", "free", 10, 20))
	exp := clk.Now().Add(time.Hour)
	if _, err := r.PutOverride(ctx, "ops", Override{ID: "svc", Subject: "key:internal", Policy: "free", Unlimited: true, ExpiresAt: exp}); err != nil {
		t.Fatal(err)
	}
	q := Query{Tier: "free", Subject: "key:internal", Method: "GET", Route: "/x"}
	other := Query{Tier: "free", Subject: "key:partner", Method: "GET", Route: "/x"}

	tests := []struct {
		name       string
		q          Query
		advance    time.Duration
		wantApply  []string
		wantExempt []string
	}{
		{"exempt subject", q, 0, []string{"all"}, []string{"free"}},
		{"other subject", other, 0, []string{"all", "free"}, nil},
		{"no subject", Query{Tier: "free", Method: "GET", Route: "/x"}, 0, []string{"all", "free"}, nil},
		{"just before expiry", q, time.Hour - time.Nanosecond, []string{"all"}, []string{"free"}},
		{"at expiry", q, time.Nanosecond, []string{"all", "free"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk.Advance(tt.advance)
			if got := ids(r.Match(tt.q)); !slices.Equal(got, tt.wantApply) {
				t.Errorf("Match(%+v) = %v, want %v", tt.q, got, tt.wantApply)
			}
			applied, ex := r.MatchExempt(tt.q)
			if got := ids(applied); !slices.Equal(got, tt.wantApply) {
				t.Errorf("MatchExempt(%+v) applied = %v, want %v", tt.q, got, tt.wantApply)
			}
			var gotEx []string
			for _, e := range ex {
				gotEx = append(gotEx, e.Policy.ID)
				if e.Override != "svc" || !e.ExpiresAt.Equal(exp) {
					t.Errorf("exemption = %+v, want override svc until %s", e, exp)
				}
			}
			if !slices.Equal(gotEx, tt.wantExempt) {
				t.Errorf("MatchExempt(%+v) exempt = %v, want %v", tt.q, gotEx, tt.wantExempt)
			}
		})
	}
}

func TestExemptionOfPolicyTurnedSecurityIsIgnored(t *testing.T) {
	ctx := t.Context()
	clk := newFakeClock()
	r := NewRegistry(RegistryConfig{Clock: clk})
	mustPut(t, r, tb("auth", "", 10, 20))
	if _, err := r.PutOverride(ctx, "ops", Override{ID: "svc", Subject: "user:1", Policy: "auth", Unlimited: true, ExpiresAt: clk.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	q := Query{Subject: "user:1", Method: "POST", Route: "/login"}
	if got := ids(r.Match(q)); len(got) != 0 {
		t.Fatalf("Match before = %v, want none", got)
	}
	p := tb("auth", "", 10, 20)
	p.Class = ClassSecurity
	mustPut(t, r, p)
	applied, ex := r.MatchExempt(q)
	if got := ids(applied); !slices.Equal(got, []string{"auth"}) || len(ex) != 0 || applied[0].Override != "" {
		t.Errorf("MatchExempt after the policy became security = %v, %v; want auth applied, no exemption", applied, ex)
	}
}

func TestUnlimitedOverrideRoundTrip(t *testing.T) {
	ctx := t.Context()
	clk := newFakeClock()
	st := &memStore{}
	r := NewRegistry(RegistryConfig{Clock: clk, Store: st})
	mustPut(t, r, tb("free", "", 10, 20))
	o := Override{ID: "svc", Subject: "user:1", Policy: "free", Unlimited: true, ExpiresAt: clk.Now().Add(time.Hour)}
	if _, err := r.PutOverride(ctx, "ops", o); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ParseOverride(b); err != nil || !reflect.DeepEqual(got, o) {
		t.Errorf("ParseOverride(%s) = %+v, %v, want %+v", b, got, err, o)
	}
	r2 := NewRegistry(RegistryConfig{Clock: clk, Store: st})
	if err := r2.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r2.Overrides(); len(got) != 1 || !got[0].Unlimited {
		t.Errorf("loaded overrides = %+v, want the exemption", got)
	}
	if got := ids(r2.Match(Query{Subject: "user:1", Method: "GET", Route: "/"})); len(got) != 0 {
		t.Errorf("loaded registry matches %v, want none", got)
	}
}

func TestAppendMatchExemptAllocs(t *testing.T) {
	clk := newFakeClock()
	r := NewRegistry(RegistryConfig{Clock: clk})
	mustPut(t, r, tb("all", "", 100, 100))
	mustPut(t, r, tb("free", "", 10, 20))
	if _, err := r.PutOverride(t.Context(), "ops", Override{ID: "svc", Subject: "user:1", Policy: "free", Unlimited: true, ExpiresAt: clk.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	q := Query{Subject: "user:1", Method: "GET", Route: "/"}
	buf := make([]Applied, 0, MaxPoliciesPerRequest)
	ex := make([]Exemption, 0, MaxPoliciesPerRequest)
	if n := testing.AllocsPerRun(100, func() { buf, ex = r.AppendMatchExempt(buf[:0], ex[:0], q) }); n != 0 {
		t.Errorf("AppendMatchExempt allocates %v times, want 0", n)
	}
}
