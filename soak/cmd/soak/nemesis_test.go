package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/soak"
)

// procState is the state letter of pid in /proc/pid/stat (T: stopped), ""
// if it cannot be read.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return rest[:1]
}

// starve stops the region's processes together, more often than not but
// not all the time, for the fault's length, and leaves every one of them
// running when it ends.
func TestStarveStopsAndLeavesRunning(t *testing.T) {
	var ds []*daemon
	for i := range 2 {
		d := &daemon{name: fmt.Sprintf("r-%d", i), bin: "/bin/sleep", args: []string{"60"}, logPath: filepath.Join(t.TempDir(), "log")}
		if err := d.start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.signal(syscall.SIGKILL) })
		ds = append(ds, d)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		starve(context.Background(), ds, soak.Fault{Kind: soak.Starve, At: time.Minute, For: 2 * time.Second})
	}()
	stopped, both, n := 0, 0, 0
	for tick := time.NewTicker(5 * time.Millisecond); ; {
		select {
		case <-done:
			tick.Stop()
			if n == 0 || stopped*3 < n || both*3 < n || stopped == n {
				t.Errorf("stopped in %d of %d looks (both at once in %d), want most but not all: let run between", stopped, n, both)
			}
			for _, d := range ds {
				if s := procState(d.pid()); s != "S" && s != "R" {
					t.Errorf("%s is %q after the starvation, want it running", d.name, s)
				}
			}
			return
		case <-tick.C:
			a, b := procState(ds[0].pid()), procState(ds[1].pid())
			n++
			if a == "T" {
				stopped++
			}
			if a == "T" && b == "T" {
				both++
			}
		}
	}
}

// A starvation cut short by the end of the run still continues every
// process it stopped.
func TestStarveInterruptedLeavesRunning(t *testing.T) {
	d := &daemon{name: "r-0", bin: "/bin/sleep", args: []string{"60"}, logPath: filepath.Join(t.TempDir(), "log")}
	if err := d.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.signal(syscall.SIGKILL) })
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for procState(d.pid()) != "T" && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	start := time.Now()
	starve(ctx, []*daemon{d}, soak.Fault{Kind: soak.Starve, For: time.Minute})
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("starve ran %v after its context ended", took)
	}
	if s := procState(d.pid()); s != "S" && s != "R" {
		t.Errorf("the process is %q after an interrupted starvation, want it running", s)
	}
}
