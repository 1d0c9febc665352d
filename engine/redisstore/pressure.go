package redisstore

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"
)

// cpuPressure tells the deadline watch whether the machine's CPUs are
// short: whether tasks, of this process or of others, wait to run. On a
// machine whose cores are all taken (a test run beside the daemon, a noisy
// neighbour), a Redis server on the same machine waits for its turn as the
// daemon does: its reply comes late, by tens or hundreds of milliseconds,
// because the machine did not run it, not because the store failed, and
// Redis decides the check all the same. Failing such a check would let the
// fallback decide it a second time.
//
// It reads the kernel's pressure stall information (/proc/pressure/cpu,
// Linux 4.20 and later), whose "some" line says for how long at least one
// task waited for a CPU: the machine is short if that was at least
// pressureShare of the last ten seconds (avg10), or of the time since the
// previous reading, when that was at most a second ago (avg10 is updated
// every two seconds, so it is late to see a load that has just begun; the
// total moves in steps, every 10 to 60 ms under load, measured, so a
// reading is compared with one at least pressureEvery older). Without PSI
// (another system, a kernel built or booted without it) it reads the tasks
// ready to run (/proc/loadavg's fourth field) and finds the machine short
// when they outnumber its CPUs. On a machine with neither it never finds
// the machine short. A verdict holds for pressureEvery: the watch asks at
// every fire of every late batch, and a reading costs a file's open and
// read.
type cpuPressure struct {
	psi, loadavg string // the files it reads; "" for none
	cpus         int

	mu      sync.Mutex
	at      time.Time     // of the last reading
	stalled time.Duration // PSI's "some" total then, if read
	read    bool
	verdict bool // short, until at + pressureEvery
}

// pressureShare is the share of time during which some task waited for a
// CPU (PSI's "some") from which the machine is short.
const pressureShare = 0.05

// pressureEvery is how long a verdict of cpuPressure holds.
const pressureEvery = 50 * time.Millisecond

// Linux's files of CPU pressure and of the tasks ready to run.
const (
	psiCPUFile  = "/proc/pressure/cpu"
	loadavgFile = "/proc/loadavg"
)

// newCPUPressure returns the pressure reader of this machine: PSI if its
// file reads, else the load average's count of runnable tasks if that
// reads, else one that never finds the machine short.
func newCPUPressure() *cpuPressure {
	p := &cpuPressure{cpus: runtime.NumCPU()}
	if _, ok := readPSI(psiCPUFile); ok {
		p.psi = psiCPUFile
	} else if _, ok := readRunnable(loadavgFile); ok {
		p.loadavg = loadavgFile
	}
	return p
}

// short reports whether the machine is short of CPU at now (see
// cpuPressure). A nil cpuPressure never finds it short.
func (p *cpuPressure) short(now time.Time) bool {
	if p == nil || (p.psi == "" && p.loadavg == "") {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.at.IsZero() && now.Sub(p.at) < pressureEvery && !now.Before(p.at) {
		return p.verdict
	}
	short := false
	switch {
	case p.psi != "":
		st, ok := readPSI(p.psi)
		since := now.Sub(p.at)
		short = ok && (st.avg10 >= 100*pressureShare ||
			(p.read && since > 0 && since <= time.Second && float64(st.total-p.stalled) >= pressureShare*float64(since)))
		p.stalled, p.read = st.total, ok
	default:
		n, ok := readRunnable(p.loadavg)
		short = ok && n > p.cpus
	}
	p.at, p.verdict = now, short
	return short
}

// psiSome is the "some" line of a PSI file: the share of the last ten
// seconds during which some task waited, in percent, and the time it
// waited in all.
type psiSome struct {
	avg10 float64
	total time.Duration
}

// readPSI reads the "some" line of a PSI file:
// "some avg10=1.50 avg60=0.00 avg300=0.00 total=12345", total in
// microseconds.
func readPSI(path string) (psiSome, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return psiSome{}, false
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	rest, ok := bytes.CutPrefix(line, []byte("some "))
	if !ok {
		return psiSome{}, false
	}
	var st psiSome
	seen := 0
	for _, f := range bytes.Fields(rest) {
		k, v, _ := bytes.Cut(f, []byte("="))
		switch string(k) {
		case "avg10":
			x, err := strconv.ParseFloat(string(v), 64)
			if err != nil || x < 0 {
				return psiSome{}, false
			}
			st.avg10, seen = x, seen+1
		case "total":
			us, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || us < 0 {
				return psiSome{}, false
			}
			st.total, seen = time.Duration(us)*time.Microsecond, seen+1
		}
	}
	return st, seen == 2
}

// readRunnable reads the tasks ready to run from a loadavg file:
// "0.50 0.40 0.30 3/345 12345", the 3.
func readRunnable(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	f := bytes.Fields(b)
	if len(f) < 4 {
		return 0, false
	}
	running, _, ok := bytes.Cut(f[3], []byte("/"))
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(string(running))
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}
