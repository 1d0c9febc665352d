package soak

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// MarkGatewayDegraded sets Degraded on the requests sent through the
// gateway via whose answers the gateway's access log says Sluice decided
// without its store. A gateway drops the body that says so on the check
// API; the shipped nginx configuration keeps Sluice's X-Sluice-Degraded
// header in $sluice_degraded, and the harness logs one line per request:
// its URI, a space, and that value ("true", or "-" when absent). Requests
// are matched by URI, which the harness makes unique. It returns how many
// requests it marked; a line of another shape is an error, since a log
// the harness cannot read would hide every degraded answer.
func MarkGatewayDegraded(reqs []Request, via string, log io.Reader) (int, error) {
	degraded := map[string]bool{}
	sc := bufio.NewScanner(log)
	for n := 1; sc.Scan(); n++ {
		uri, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || uri == "" || (v != "true" && v != "-" && v != "") {
			return 0, fmt.Errorf("access log line %d: want \"<uri> <degraded>\", got %q", n, sc.Text())
		}
		if v == "true" {
			degraded[uri] = true
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("access log: %w", err)
	}
	marked := 0
	for i := range reqs {
		if r := &reqs[i]; r.Via == via && r.URI != "" && degraded[r.URI] && !r.Degraded {
			r.Degraded = true
			marked++
		}
	}
	return marked, nil
}
