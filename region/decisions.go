package region

import (
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice/decisionlog"
)

// TopLimited is the body of GET /v1/decisions/top: per policy and kind
// (rejected by an enforced policy, would_reject by a shadow one), the
// subjects limited most over the recent window.
type TopLimited struct {
	// WindowSeconds is the window's length: the lists cover between one
	// and two windows of the most recent decisions.
	WindowSeconds float64                 `json:"window_seconds"`
	Lists         []decisionlog.PolicyTop `json:"lists"`
}

// maxTopLimit bounds the limit parameter of GET /v1/decisions/top.
const maxTopLimit = 1000

func (d *Daemon) handleTopLimited(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if k != "policy" && k != "limit" {
			d.fail(w, r, invalid(k, "unknown query parameter"))
			return
		}
	}
	n := 10
	if s := q.Get("limit"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > maxTopLimit {
			d.fail(w, r, invalid("limit", "must be an integer from 1 to %d, got %q", maxTopLimit, clipStr(s)))
			return
		}
		n = v
	}
	policy := q.Get("policy")
	if policy != "" {
		if _, ok := d.reg.Get(policy); !ok {
			d.fail(w, r, newProblem(http.StatusNotFound, ProblemNotFound, "no such policy: "+clipStr(policy)))
			return
		}
	}
	out := TopLimited{WindowSeconds: d.events.Window().Seconds(), Lists: d.events.Top(time.Now(), policy, n)}
	if out.Lists == nil {
		out.Lists = []decisionlog.PolicyTop{}
	}
	writeJSON(w, http.StatusOK, out)
}
