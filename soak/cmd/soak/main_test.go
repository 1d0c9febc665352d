package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	sluice "github.com/sluice-rl/sluice/region"
	"github.com/sluice-rl/sluice/soak"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string
	}{
		{[]string{"-duration", "5m", "-seed", "3"}, ""},
		{[]string{"-faults", "kill-daemon,partition"}, ""},
		{[]string{"-seed", "x"}, `-seed "x": not an unsigned integer`},
		{[]string{"-seed", "-1"}, `-seed "-1": not an unsigned integer`},
		{[]string{"-duration", "5q"}, `-duration "5q": not a duration`},
		{[]string{"-duration", "30s"}, "at least 2m"},
		{[]string{"-faults", "kill-daemon,meteor"}, `unknown fault "meteor"`},
		{[]string{"-inject", "gremlins"}, `-inject "gremlins"`},
		{[]string{"-gossip-preset", "lan"}, ""},
		{[]string{"-gossip-preset", "moon"}, `-gossip-preset "moon": want local, lan or wan`},
		{[]string{"-nope"}, "flag provided but not defined"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	}
	for _, tc := range tests {
		o, err := parseFlags(tc.args)
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("parseFlags(%q) = %v, want no error", tc.args, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "\n") {
			t.Errorf("parseFlags(%q) error = %v, want one line with %q", tc.args, err, tc.wantErr)
		}
		_ = o
	}
	o, _ := parseFlags([]string{"-duration", "5m", "-seed", "3"})
	if o.duration != 5*time.Minute || o.seed != 3 || len(o.kinds) != len(soak.Kinds) || o.preset != "local" {
		t.Errorf("parseFlags(-duration 5m -seed 3) = %+v", o)
	}
}

// The soak's HTTP clients let an idle connection go before the daemon
// closes it: a check sent on a connection the daemon was closing failed
// with EOF, and no fault was active to explain it.
func TestClientsCloseIdleConnectionsFirst(t *testing.T) {
	tr, ok := httpClient.Transport.(*http.Transport)
	if !ok {
		t.Fatalf("httpClient.Transport is a %T, want an *http.Transport with an idle timeout", httpClient.Transport)
	}
	if tr.IdleConnTimeout <= 0 || tr.IdleConnTimeout >= sluice.IdleTimeout {
		t.Errorf("the clients keep idle connections %v, the daemon %v: want the clients' shorter", tr.IdleConnTimeout, sluice.IdleTimeout)
	}
}
