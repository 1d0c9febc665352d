package redisstore

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestCPUPressure reads PSI and loadavg files as Linux writes them: a
// machine is short of CPU when PSI's ten seconds' share reaches
// pressureShare, or its total grew by that share of the time since a
// reading at most a second old; without PSI, when more tasks are ready to
// run than there are CPUs. A verdict holds for pressureEvery.
func TestCPUPressure(t *testing.T) {
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	write := func(name, text string) string {
		if err := os.WriteFile(path(name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path(name)
	}
	psi := func(avg10 string, totalUS int) string {
		return "some avg10=" + avg10 + " avg60=0.00 avg300=0.00 total=" + strconv.Itoa(totalUS) + "\n" +
			"full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
	}
	t0 := time.Unix(1_800_000_000, 0)
	type reading struct {
		after time.Duration // since t0
		file  string        // the PSI file's text then
		want  bool
	}
	for _, tt := range []struct {
		name     string
		readings []reading
	}{
		{"idle", []reading{{0, psi("0.00", 1000), false}, {100 * time.Millisecond, psi("0.00", 1000), false}}},
		{"loaded for ten seconds", []reading{{0, psi("62.66", 1000), true}}},
		{"a load that has just begun", []reading{{0, psi("0.00", 1000), false}, {100 * time.Millisecond, psi("0.00", 11000), true}}},
		{"below the share", []reading{{0, psi("0.00", 1000), false}, {100 * time.Millisecond, psi("0.00", 5000), false}}},
		{"growth over more than a second", []reading{{0, psi("0.00", 1000), false}, {2 * time.Second, psi("0.00", 901000), false}}},
		{"a verdict holds for pressureEvery", []reading{{0, psi("62.66", 1000), true}, {pressureEvery / 2, psi("0.00", 1000), true},
			{pressureEvery, psi("0.00", 1000), false}}},
		{"unreadable", []reading{{0, "some avg10=x total=12\n", false}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := &cpuPressure{psi: path("psi-" + tt.name)}
			for _, r := range tt.readings {
				write("psi-"+tt.name, r.file)
				if got := p.short(t0.Add(r.after)); got != r.want {
					t.Errorf("short after %v reading %q = %v, want %v", r.after, r.file, got, r.want)
				}
			}
		})
	}
	for _, tt := range []struct {
		name string
		p    *cpuPressure
		want bool
	}{
		{"loadavg within the CPUs", &cpuPressure{loadavg: write("la2", "0.50 0.40 0.30 2/345 12345\n"), cpus: 2}, false},
		{"loadavg past the CPUs", &cpuPressure{loadavg: write("la3", "3.50 0.40 0.30 3/345 12345\n"), cpus: 2}, true},
		{"loadavg unreadable", &cpuPressure{loadavg: write("lax", "0.50 0.40\n"), cpus: 2}, false},
		{"psi missing", &cpuPressure{psi: path("none")}, false},
		{"neither", &cpuPressure{cpus: 2}, false},
		{"none at all", nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.short(t0); got != tt.want {
				t.Errorf("short = %v, want %v", got, tt.want)
			}
		})
	}
}
