package soak

import (
	"strings"
	"testing"
)

func TestMarkGatewayDegraded(t *testing.T) {
	reqs := func() []Request {
		return []Request{
			{Via: "nginx", URI: "/gw/a?n=1"},
			{Via: "nginx", URI: "/gw/a?n=2"},
			{Via: "check", URI: "/gw/a?n=3"}, // not through the gateway
			{Via: "nginx"},                   // no URI: never matched
		}
	}
	for _, tc := range []struct {
		name    string
		log     string
		want    []bool // Degraded of each request after
		marked  int
		wantErr string
	}{
		{name: "none degraded", log: "/gw/a?n=1 -\n/gw/a?n=2 -\n", want: []bool{false, false, false, false}},
		{name: "one degraded", log: "/gw/a?n=1 -\n/gw/a?n=2 true\n", want: []bool{false, true, false, false}, marked: 1},
		{name: "only the gateway's requests", log: "/gw/a?n=3 true\n", want: []bool{false, false, false, false}},
		{name: "a request the log lacks stays as it was", log: "", want: []bool{false, false, false, false}},
		{name: "an empty value is no header", log: "/gw/a?n=1 \n", want: []bool{false, false, false, false}},
		{name: "a line of another shape", log: "/gw/a?n=1 true\nnonsense\n", wantErr: "line 2"},
		{name: "a value that is not the header's", log: "/gw/a?n=1 yes\n", wantErr: "line 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := reqs()
			n, err := MarkGatewayDegraded(rs, "nginx", strings.NewReader(tc.log))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if n != tc.marked {
				t.Errorf("marked %d, want %d", n, tc.marked)
			}
			for i, r := range rs {
				if r.Degraded != tc.want[i] {
					t.Errorf("request %d (%s %s): degraded %v, want %v", i, r.Via, r.URI, r.Degraded, tc.want[i])
				}
			}
		})
	}
}
