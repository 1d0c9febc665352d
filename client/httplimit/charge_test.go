package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/client/httplimit"
	"github.com/sluice-rl/sluice/client/internal/daemontest"
	"github.com/sluice-rl/sluice/client/local"
	"github.com/sluice-rl/sluice/quota"
)

// chargers are a daemon's client and an in-process limiter over the same
// policies, both of which check and charge.
func chargers(t *testing.T, policies []quota.Policy) map[string]httplimit.Checker {
	t.Helper()
	url, stop := daemontest.Start(policies)
	t.Cleanup(stop)
	c, err := client.New(client.Config{Server: url})
	if err != nil {
		t.Fatal(err)
	}
	reg := quota.NewRegistry(quota.RegistryConfig{})
	if err := reg.Seed(context.Background(), "test", policies); err != nil {
		t.Fatal(err)
	}
	return map[string]httplimit.Checker{"daemon": c, "local": local.New(nil, reg)}
}

func post(t *testing.T, url, user, password string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/login", nil)
	req.Header.Set("X-User", user)
	req.Header.Set("X-Password", password)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// TestFailedLoginsOnlyAreCounted is the worked case of a login policy that
// counts failures only, charged after the response by its status: any
// number of successful logins never locks a user out, and three failures
// in the window lock the user (and only that user) after the fourth.
func TestFailedLoginsOnlyAreCounted(t *testing.T) {
	policies := []quota.Policy{{ID: "login-failures", Algorithm: "fixed_window", Count: 3, Window: 600,
		Mode: quota.ModeEnforce, Class: quota.ClassSecurity, Match: quota.Match{Routes: []string{"/login"}}}}
	for name, checker := range chargers(t, policies) {
		t.Run(name, func(t *testing.T) {
			mw, err := httplimit.New(httplimit.Config{Checker: checker, Subject: byUser,
				Charge: httplimit.ChargeStatus(1, http.StatusUnauthorized)})
			if err != nil {
				t.Fatal(err)
			}
			login := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Password") != "right" {
					w.WriteHeader(http.StatusUnauthorized)
				}
			})
			srv := httptest.NewServer(mw(login))
			t.Cleanup(srv.Close)
			for i := range 20 {
				if got := post(t, srv.URL, "alice", "right"); got != 200 {
					t.Fatalf("successful login %d = %d, want 200: successes must never lock out", i+1, got)
				}
			}
			for i := range 4 {
				if got := post(t, srv.URL, "mallory", "guess"+strconv.Itoa(i)); got != 401 {
					t.Fatalf("failed login %d = %d, want 401 (still allowed to try)", i+1, got)
				}
			}
			if got := post(t, srv.URL, "mallory", "right"); got != 429 {
				t.Fatalf("login after 4 failures = %d, want 429", got)
			}
			if got := post(t, srv.URL, "alice", "right"); got != 200 {
				t.Fatalf("another user's login after mallory was locked = %d, want 200", got)
			}
		})
	}
}

// TestChargeHeaderSettlesTheEstimate: with an estimate (Cost) and a cost
// reported by the handler in a header set after the body, the check holds
// the estimate and the charge settles it, so the requester pays what the
// handler reported, no more; without a header nothing is charged and
// OnError hears of it.
func TestChargeHeaderSettlesTheEstimate(t *testing.T) {
	policies := []quota.Policy{{ID: "tokens", Algorithm: "fixed_window", Count: 1000, Window: 3600, Mode: quota.ModeEnforce}}
	for name, checker := range chargers(t, policies) {
		t.Run(name, func(t *testing.T) {
			var errs []error
			mw, err := httplimit.New(httplimit.Config{Checker: checker, Subject: byUser, ChargeHeader: "X-Tokens",
				Cost:    func(*http.Request) (int64, bool) { return 100, true },
				OnError: func(_ *http.Request, err error) { errs = append(errs, err) }})
			if err != nil {
				t.Fatal(err)
			}
			used := []string{"30", "170", "", "5"}
			n := 0
			h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Write([]byte("completion"))
				if v := used[n]; v != "" {
					w.Header().Set("X-Tokens", v)
				}
				n++
			})
			srv := httptest.NewServer(mw(h))
			t.Cleanup(srv.Close)
			for range used {
				if a := get(t, srv.URL, "u"); a.status != 200 {
					t.Fatalf("request = %d %s", a.status, a.body)
				}
			}
			zero := int64(0)
			d, err := checker.Check(context.Background(), client.CheckRequest{SubjectFields: quota.SubjectFields{User: "u"}, Route: "/v1/orders", Cost: &zero})
			if err != nil {
				t.Fatal(err)
			}
			// 30 + 170 + 5 settled; the third request's estimate of 100
			// stands, its reservation left to expire.
			if want := int64(1000 - 30 - 170 - 100 - 5); d.Remaining != want {
				t.Errorf("remaining %d, want %d", d.Remaining, want)
			}
			if len(errs) != 1 {
				t.Errorf("OnError heard %v, want one error for the missing header", errs)
			}
		})
	}
}
