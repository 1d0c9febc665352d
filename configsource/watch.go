package configsource

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/quota"
)

// DefaultInterval is how often a Watcher reads its files. A change is in
// force after two reads that agree, so within about twice this.
const DefaultInterval = 250 * time.Millisecond

// FileConfig configures a Watcher of files.
type FileConfig struct {
	// Source names the source in ownership, logs and metrics, e.g.
	// "envoy-config".
	Source string
	// Paths are files and directories (see ReadFiles).
	Paths []string
	// Exts are the file names read in directories, e.g. EnvoyExts.
	Exts []string
	// MaxBytes bounds one file.
	MaxBytes int64
	// Parse turns the files into policies.
	Parse Parser
	// Interval is how often the files are read; zero is DefaultInterval.
	Interval time.Duration
}

// Validate reports a configuration that cannot work.
func (c FileConfig) Validate() error {
	switch {
	case c.Source == "":
		return errors.New("configsource: a source needs a name")
	case len(c.Paths) == 0:
		return fmt.Errorf("configsource %s: no path to watch", c.Source)
	case c.Parse == nil || c.MaxBytes <= 0 || len(c.Exts) == 0:
		return fmt.Errorf("configsource %s: Parse, MaxBytes and Exts are required", c.Source)
	case c.Interval < 0:
		return fmt.Errorf("configsource %s: interval must not be negative", c.Source)
	}
	return nil
}

// Load reads and parses the files of c once, strictly (ReadFiles): the
// configuration at start, where any error stops the start.
func Load(c FileConfig) (Files, []quota.Policy, error) {
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	files, err := ReadFiles(c.Paths, c.Exts, c.MaxBytes, true)
	if err != nil {
		return nil, nil, err
	}
	ps, err := c.Parse(files)
	if err != nil {
		return nil, nil, err
	}
	return files, ps, nil
}

// Watcher reads the files of one source on a ticker and puts what they
// configure in force through an Applier, once two reads agree (Settle).
type Watcher struct {
	cfg    FileConfig
	apply  *Applier
	report *Reporter
	settle Settle
}

// NewWatcher returns a Watcher of c that starts from start, the files
// read at start whose policies are already in force and claimed.
func NewWatcher(c FileConfig, start Files, a *Applier, r *Reporter) (*Watcher, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	w := &Watcher{cfg: c, apply: a, report: r}
	w.settle.Taken(start.Fingerprint())
	r.Start(c.Source, a.Owned(c.Source))
	return w, nil
}

// Run reads the files every Interval until ctx is done.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		w.Poll(ctx)
	}
}

// Poll reads the files once and, when the read settles on a new
// configuration, parses and applies it.
func (w *Watcher) Poll(ctx context.Context) {
	files, err := ReadFiles(w.cfg.Paths, w.cfg.Exts, w.cfg.MaxBytes, false)
	fp := ""
	if err != nil {
		fp = "error:" + err.Error()
	} else {
		fp = files.Fingerprint()
	}
	if !w.settle.Observe(fp) {
		return
	}
	if err != nil {
		w.report.Refused(w.cfg.Source, asError("", err))
		w.settle.Done(fp)
		return
	}
	ps, err := w.cfg.Parse(files)
	if err != nil {
		w.report.Refused(w.cfg.Source, err)
		w.settle.Done(fp)
		return
	}
	w.applyPolicies(ctx, fp, ps)
}

func (w *Watcher) applyPolicies(ctx context.Context, fp string, ps []quota.Policy) {
	p, err := w.apply.Apply(ctx, w.cfg.Source, ps)
	var oe *OwnerError
	var re *RefusedError
	switch {
	case errors.As(err, &oe) || errors.As(err, &re):
		w.report.Refused(w.cfg.Source, err)
		w.settle.Done(fp)
	case err != nil:
		w.report.Failed(w.cfg.Source, err)
	default:
		w.report.Applied(w.cfg.Source, p, w.apply.Owned(w.cfg.Source))
		w.settle.Done(fp)
	}
}
