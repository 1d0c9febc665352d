//go:build simlive

package live

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/simulator"
)

// The comparisons of this build tag (make sim-live) are measurements: each
// records its figures, one Markdown table row per run, in the file
// SIM_LIVE_OUT names (nothing when it is unset), and make sim-live puts
// the rows into docs/simulation-results.md.

var recordMu sync.Mutex

// recordAtEnd appends, once t has ended, the row of its live run (*live,
// timed from now, with *st), beside its virtual run when virt is not nil,
// to SIM_LIVE_OUT, with t's verdict.
func recordAtEnd(t *testing.T, live *simulator.Result, virt *simulator.Result, st *Stats) {
	start := time.Now()
	t.Cleanup(func() { record(t, *live, virt, time.Since(start), *st) })
}

func record(t *testing.T, live simulator.Result, virt *simulator.Result, took time.Duration, st Stats) {
	path := os.Getenv("SIM_LIVE_OUT")
	if path == "" {
		return
	}
	vp99, vadm := "–", "–"
	if virt != nil {
		vp99 = fmt.Sprintf("%.2f", virt.Summary.GlobalErrorP99Pct)
		vadm = fmt.Sprintf("%.2f", virt.Summary.AdmittedVsOracle)
	}
	verdict := "pass"
	switch {
	case t.Failed():
		verdict = "FAIL"
	case t.Skipped():
		verdict = "skipped: machine behind"
	}
	row := fmt.Sprintf("| %s | %.2f | %s | %.2f | %s | %v | %v | %s |\n", t.Name(),
		live.Summary.GlobalErrorP99Pct, vp99, live.Summary.AdmittedVsOracle, vadm,
		took.Round(time.Second), st.LateP99.Round(time.Millisecond), verdict)
	recordMu.Lock()
	defer recordMu.Unlock()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Errorf("SIM_LIVE_OUT: %v", err)
		return
	}
	defer f.Close()
	if _, err := f.WriteString(row); err != nil {
		t.Errorf("SIM_LIVE_OUT: %v", err)
	}
}
