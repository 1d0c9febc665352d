package simulator

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"html"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Chart is one rendered chart: File is its name inside the output
// directory, SVG its bytes.
type Chart struct {
	File  string
	Title string
	SVG   []byte
}

// maxRegionCharts caps the per-region charts of a run with many regions.
const maxRegionCharts = 10

// Charts renders r's charts (gonum.org/v1/plot, SVG): admitted vs limit
// and oracle over time globally and per region (key 0), and shares over
// time. Rates are per second, averaged over each 10 s window.
func Charts(r Result) ([]Chart, error) {
	var out []Chart
	add := func(file, title string, p *plot.Plot) error {
		b, err := render(p)
		if err != nil {
			return fmt.Errorf("chart %s: %w", file, err)
		}
		out = append(out, Chart{File: file, Title: title, SVG: b})
		return nil
	}
	w := windowLen.Seconds()
	// Global.
	p := newPlot("Global: admitted vs oracle and limit", "units/s")
	var adm, orc, lim plotter.XYs
	for _, x := range r.Windows {
		t := x.StartS + w/2
		adm = append(adm, plotter.XY{X: t, Y: float64(x.Admitted) / w})
		orc = append(orc, plotter.XY{X: t, Y: float64(x.Oracle) / w})
		lim = append(lim, plotter.XY{X: t, Y: x.Limit / w})
	}
	if err := lines(p, []string{"admitted", "oracle", "limit"}, adm, orc, lim); err != nil {
		return nil, err
	}
	if err := add("global.svg", "Global admitted vs oracle and limit", p); err != nil {
		return nil, err
	}
	// Per region (key 0).
	for i := 0; i < r.Regions && i < maxRegionCharts; i++ {
		p := newPlot(fmt.Sprintf("Region %s (key 0): admitted vs oracle and share", regionName(i)), "units/s")
		var adm, orc, allowed plotter.XYs
		for _, x := range r.Windows {
			if i >= len(x.Regions) {
				continue
			}
			rw := x.Regions[i]
			t := x.StartS + w/2
			adm = append(adm, plotter.XY{X: t, Y: float64(rw.Admitted) / w})
			orc = append(orc, plotter.XY{X: t, Y: (float64(rw.Admitted) - rw.OracleErrorPct*x.Limit/100) / w})
			allowed = append(allowed, plotter.XY{X: t, Y: rw.Allowed / w})
		}
		if err := lines(p, []string{"admitted", "oracle (its traffic × central admit ratio)", "share × L"}, adm, orc, allowed); err != nil {
			return nil, err
		}
		if err := add(fmt.Sprintf("region-%s.svg", regionName(i)), "Region "+regionName(i), p); err != nil {
			return nil, err
		}
	}
	// Shares.
	p = newPlot("Shares of L (key 0)", "fraction of L")
	names := make([]string, 0, r.Regions)
	series := make([]plotter.XYs, 0, r.Regions)
	for i := 0; i < r.Regions; i++ {
		var xy plotter.XYs
		for _, x := range r.Windows {
			if i < len(x.Regions) {
				xy = append(xy, plotter.XY{X: x.StartS + w/2, Y: x.Regions[i].Share})
			}
		}
		names = append(names, regionName(i))
		series = append(series, xy)
	}
	if err := lines(p, names, series...); err != nil {
		return nil, err
	}
	if err := add("shares.svg", "Shares over time", p); err != nil {
		return nil, err
	}
	return out, nil
}

func newPlot(title, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "time (s)"
	p.Y.Label.Text = y
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	return p
}

var palette = []color.RGBA{
	{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, {R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, {R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, {R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, {R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff}, {R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}, {R: 0xbc, G: 0xbd, B: 0x22, A: 0xff},
	{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff},
}

func lines(p *plot.Plot, names []string, series ...plotter.XYs) error {
	for i, xy := range series {
		if len(xy) == 0 {
			continue
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		if i >= len(palette) {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		p.Add(l)
		p.Legend.Add(names[i], l)
	}
	return nil
}

func render(p *plot.Plot) ([]byte, error) {
	wt, err := p.WriterTo(8*vg.Inch, 4*vg.Inch, "svg")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if _, err := wt.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// WriteOutputs writes r into dir: <scenario>.json, the charts as SVG files
// and report.html, one self-contained page (the charts embedded as data:
// URIs, the summary and target table inline). It returns the files
// written, relative to dir.
func WriteOutputs(dir string, r Result) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var js bytes.Buffer
	if err := WriteJSON(&js, r); err != nil {
		return nil, err
	}
	files := []string{r.Scenario + ".json"}
	if err := os.WriteFile(filepath.Join(dir, files[0]), js.Bytes(), 0o644); err != nil {
		return nil, err
	}
	charts, err := Charts(r)
	if err != nil {
		return nil, err
	}
	for _, c := range charts {
		if err := os.WriteFile(filepath.Join(dir, c.File), c.SVG, 0o644); err != nil {
			return nil, err
		}
		files = append(files, c.File)
	}
	var h bytes.Buffer
	if err := WriteHTML(&h, r, charts); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.html"), h.Bytes(), 0o644); err != nil {
		return nil, err
	}
	return append(files, "report.html"), nil
}

// WriteHTML writes one self-contained HTML page for r: the terminal
// summary, the targets and every chart embedded as a data: URI (each
// <img> also names its SVG file in data-file and alt).
func WriteHTML(w io.Writer, r Result, charts []Chart) error {
	var b strings.Builder
	esc := html.EscapeString
	fmt.Fprintf(&b, "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sluice simulation: %s</title>\n", esc(r.Scenario))
	b.WriteString("<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}" +
		"td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}.pass{color:#080}.fail{color:#b00;font-weight:bold}img{max-width:100%}</style></head><body>\n")
	fmt.Fprintf(&b, "<h1>Simulation: %s</h1>\n<p>%s</p>\n", esc(r.Scenario), esc(r.Description))
	var tab strings.Builder
	if err := WriteTable(&tab, Result{Scenario: r.Scenario, Seed: r.Seed, Regions: r.Regions, Limit: r.Limit,
		DurationS: r.DurationS, Summary: r.Summary, Targets: r.Targets}); err != nil {
		return err
	}
	fmt.Fprintf(&b, "<pre>%s</pre>\n", esc(tab.String()))
	if len(r.Targets) > 0 {
		b.WriteString("<h2>Targets</h2>\n<table><tr><th>Metric</th><th>Target</th><th>Our figure</th><th>Result</th><th>Note</th></tr>\n")
		for _, t := range r.Targets {
			cls, word := "pass", "pass"
			if !t.Pass {
				cls, word = "fail", "MISSED"
			}
			fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td><td>%g</td><td class=\"%s\">%s</td><td>%s</td></tr>\n",
				esc(t.Metric), esc(bounds(t.Target)), t.Value, cls, word, esc(t.Note))
		}
		b.WriteString("</table>\n")
	}
	for _, c := range charts {
		fmt.Fprintf(&b, "<h2>%s</h2>\n<img data-file=\"%s\" alt=\"%s\" src=\"data:image/svg+xml;base64,%s\">\n",
			esc(c.Title), esc(c.File), esc(c.File), base64.StdEncoding.EncodeToString(c.SVG))
	}
	b.WriteString("</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// NotesMarker separates the generated tables of docs/simulation-results.md
// from the notes written by hand below it, which WriteResultsDoc keeps.
const NotesMarker = "<!-- notes: written by hand, kept by simreport -->"

// WriteResultsDoc writes docs/simulation-results.md: one table per seed
// (runs[i] holds every built-in scenario run with seeds[i]), each row with
// the scenario's error figures, its message cost (reports, borrow requests
// and loans, bytes per second per region) and its targets, then the worst
// of the seeds per scenario, then notes (the text after NotesMarker, kept
// from the previous file).
func WriteResultsDoc(w io.Writer, seeds []uint64, runs [][]Result, notes string) error {
	var b strings.Builder
	b.WriteString("# Simulation results\n\n")
	b.WriteString("Generated by `go run ./simulator/cmd/simreport` (`make sim-report`); only the notes at the end are written by hand.\n")
	b.WriteString("Errors are percent of L_global per 10 s window, warm-up excluded; see docs/simulator.md. Messages are the\n")
	b.WriteString("bytes of reports, borrow requests and loans sent per second per region.\n")
	for i, seed := range seeds {
		fmt.Fprintf(&b, "\n## Seed %d\n\n", seed)
		b.WriteString("| Scenario | E₁₀ p99 | E₁₀ max | Regional p99 | Overshoot | Convergence | Messages B/s | NFR-02 | Target | Our figure | Pass |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range runs[i] {
			s := r.Summary
			lead := fmt.Sprintf("| %s | %.2f%% | %.2f%% | %.2f%% | %.2f%% | %gs | %.0f | %s | ", r.Scenario, s.GlobalErrorP99Pct,
				s.GlobalErrorMaxPct, s.RegionalErrorP99, s.OvershootMaxPct, s.ConvergenceS, s.ReportBytesPerS, passFail(s.NFR02Pass))
			for j, t := range r.Targets {
				if j > 0 {
					lead = "| | | | | | | | | "
				}
				fmt.Fprintf(&b, "%s%s %s | %g | %s |\n", lead, t.Metric, bounds(t.Target), t.Value, missed(t.Pass))
			}
		}
	}
	if len(seeds) > 1 {
		fmt.Fprintf(&b, "\n## Worst of seeds %s\n\n", seedList(seeds))
		b.WriteString("| Scenario | E₁₀ p99 | Overshoot | Per-key p99 | Messages B/s | Targets missed |\n|---|---|---|---|---|---|\n")
		for k := range runs[0] {
			var p99, over, key, msgs float64
			var miss []string
			for i := range seeds {
				s := runs[i][k].Summary
				p99, over, key, msgs = max(p99, s.GlobalErrorP99Pct), max(over, s.OvershootMaxPct), max(key, s.KeyErrorP99Pct), max(msgs, s.ReportBytesPerS)
				for _, t := range runs[i][k].Targets {
					if !t.Pass {
						miss = append(miss, fmt.Sprintf("%s (seed %d: %g)", t.Metric, seeds[i], t.Value))
					}
				}
			}
			m := "none"
			if len(miss) > 0 {
				m = "**" + strings.Join(miss, ", ") + "**"
			}
			fmt.Fprintf(&b, "| %s | %.2f%% | %.2f%% | %.2f%% | %.0f | %s |\n", runs[0][k].Scenario, p99, over, key, msgs, m)
		}
	}
	b.WriteString("\nMisses are reported as measured; targets are not loosened.\n\n")
	b.WriteString(NotesMarker + "\n")
	if notes = strings.TrimSpace(notes); notes != "" {
		b.WriteString("\n" + notes + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func seedList(seeds []uint64) string {
	s := make([]string, len(seeds))
	for i, v := range seeds {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}
