package soak

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// Report is what a soak run saw and what the checker made of it.
type Report struct {
	Seed        uint64    `json:"seed"`
	Duration    string    `json:"duration"`
	Started     time.Time `json:"started"`
	Ended       time.Time `json:"ended"`
	Interrupted bool      `json:"interrupted"`
	Injected    string    `json:"injected,omitempty"` // a deliberate fault hidden from the checker
	// InjectedSeen counts the over-admissions of the injected policy the
	// checker reported after the injection.
	InjectedSeen int            `json:"injected_seen,omitempty"`
	Bounds       Bounds         `json:"bounds"`
	Schedule     []Fault        `json:"schedule"`
	Faults       []Span         `json:"faults"`
	Policies     []PolicyState  `json:"policies"`
	Counts       map[string]int `json:"counts"` // requests by via and status
	Latency      []LatencyPoint `json:"latency"`
	Windows      []WindowFigure `json:"windows"`
	Samples      []Sample       `json:"samples"`
	Leaks        []LeakFigure   `json:"leaks"`
	// Degraded is, per region, how many answers with every store and
	// daemon of the region up the fallback decided (Bounds.DegradedHealthy).
	Degraded []DegradedFigure `json:"degraded"`
	// Losses is how many times a daemon found another region out of
	// contact, and how many of those no fault explains (FalsePartitions).
	Losses     LossFigure  `json:"losses"`
	Violations []Violation `json:"violations"`
	Errors     []string    `json:"errors,omitempty"` // what the runner could not do
}

// LatencyPoint is the latency quantiles of the answers sent in one
// 10 s bucket, in milliseconds.
type LatencyPoint struct {
	At  time.Time `json:"at"`
	N   int       `json:"n"`
	P50 float64   `json:"p50_ms"`
	P99 float64   `json:"p99_ms"`
	Max float64   `json:"max_ms"`
}

// Counts tallies reqs by how they went and what they were answered.
func Counts(reqs []Request) map[string]int {
	out := map[string]int{}
	for _, r := range reqs {
		k := fmt.Sprintf("%s %d", r.Via, r.Status)
		if r.Err != "" {
			k = r.Via + " error"
		} else if !r.Decided && r.Admitted() {
			k = r.Via + " 200 undecided"
		}
		out[k]++
	}
	return out
}

// Latencies returns the quantiles of reqs' answers per bucket of width.
func Latencies(reqs []Request, width time.Duration) []LatencyPoint {
	buckets := map[int64][]float64{}
	for _, r := range reqs {
		if r.Err != "" {
			continue
		}
		b := r.Start.UnixNano() / int64(width)
		buckets[b] = append(buckets[b], float64(r.End.Sub(r.Start).Microseconds())/1000)
	}
	var out []LatencyPoint
	for b, ls := range buckets {
		sort.Float64s(ls)
		q := func(p float64) float64 { return ls[min(len(ls)-1, int(p*float64(len(ls))))] }
		out = append(out, LatencyPoint{At: time.Unix(0, b*int64(width)), N: len(ls), P50: q(0.5), P99: q(0.99), Max: ls[len(ls)-1]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// WriteJSON writes r as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(r)
}

// Summary is one line saying how the run went.
func (r *Report) Summary() string {
	n := 0
	for _, c := range r.Counts {
		n += c
	}
	rules := map[string]int{}
	for _, v := range r.Violations {
		rules[v.Rule]++
	}
	leaks := []string{}
	for _, l := range r.Leaks {
		f := fmt.Sprintf("%s %.0f->%.0f", l.Name, l.Before, l.After)
		if l.Mark > 0 {
			f += fmt.Sprintf(" (mark %.0f)", l.Mark)
		}
		leaks = append(leaks, f)
	}
	s := fmt.Sprintf("SOAK seed=%d duration=%s requests=%d faults=%d violations=%d %v interrupted=%v leaks=[%s]",
		r.Seed, r.Duration, n, len(r.Faults), len(r.Violations), rules, r.Interrupted, strings.Join(leaks, ", "))
	var deg []string
	for _, d := range r.Degraded {
		deg = append(deg, fmt.Sprintf("%s %d/%d", d.Region, d.Degraded, d.Answers))
	}
	s += fmt.Sprintf(" degraded_healthy=[%s] regions_lost=%d unexplained=%d (reclaimed %d)", strings.Join(deg, ", "), r.Losses.Explained+r.Losses.Unexplained, r.Losses.Unexplained, r.Losses.UnexplainedReclaimed)
	if r.Injected != "" {
		s += fmt.Sprintf(" injected_seen=%d", r.InjectedSeen)
	}
	return s
}

// series is one line of a chart.
type series struct {
	name  string
	color string
	x     []time.Time
	y     []float64
}

// WriteHTML writes r as one self-contained page: the summary, charts as
// inline SVG with the faults as bands, the leak figures and every
// violation.
func (r *Report) WriteHTML(w io.Writer) error {
	var b strings.Builder
	b.WriteString("<!doctype html><html><head><meta charset=utf-8><title>Sluice soak</title><style>" +
		"body{font:14px sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}" +
		"td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px;text-align:left}.bad{color:#b00}</style></head><body>")
	fmt.Fprintf(&b, "<h1>Sluice soak</h1><p><code>%s</code></p>", html.EscapeString(r.Summary()))
	fmt.Fprintf(&b, "<p>Started %s, ended %s.</p>", r.Started.UTC().Format(time.RFC3339), r.Ended.UTC().Format(time.RFC3339))
	keys := map[string][]WindowFigure{}
	for _, f := range r.Windows {
		keys[f.Key] = append(keys[f.Key], f)
	}
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		adm, bound := series{name: "admitted", color: "#1f77b4"}, series{name: "bound", color: "#d62728"}
		for _, f := range keys[k] {
			adm.x, adm.y = append(adm.x, f.From), append(adm.y, float64(f.Admitted))
			bound.x, bound.y = append(bound.x, f.From), append(bound.y, f.Bound)
		}
		b.WriteString(r.chart("Admitted per window against the bound: "+k+" (the hot subject)", adm, bound))
	}
	p50, p99 := series{name: "p50 ms", color: "#2ca02c"}, series{name: "p99 ms", color: "#ff7f0e"}
	for _, l := range r.Latency {
		p50.x, p50.y = append(p50.x, l.At), append(p50.y, l.P50)
		p99.x, p99.y = append(p99.x, l.At), append(p99.y, l.P99)
	}
	b.WriteString(r.chart("Latency per 10 s", p50, p99))
	rss, gor, fds := series{name: "RSS MB", color: "#9467bd"}, series{name: "goroutines", color: "#8c564b"}, series{name: "fds", color: "#17becf"}
	keysS := series{name: "redis keys", color: "#7f7f7f"}
	for _, s := range r.Samples {
		rss.x, rss.y = append(rss.x, s.At), append(rss.y, float64(s.RSSBytes)/1e6)
		gor.x, gor.y = append(gor.x, s.At), append(gor.y, float64(s.Goroutines))
		fds.x, fds.y = append(fds.x, s.At), append(fds.y, float64(s.FDs))
		keysS.x, keysS.y = append(keysS.x, s.At), append(keysS.y, float64(s.RedisKeys))
	}
	b.WriteString(r.chart("Daemons' RSS (sum)", rss))
	b.WriteString(r.chart("Daemons' goroutines and open files (sums)", gor, fds))
	b.WriteString(r.chart("Redis keys (sum over primaries)", keysS))
	r.tables(&b)
	b.WriteString("</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Report) tables(b *strings.Builder) {
	b.WriteString("<h2>Leaks: before the faults and after</h2><table><tr><th>resource<th>before<th>after<th>ratio<th>high-water mark allowed<th>ok</tr>")
	for _, l := range r.Leaks {
		mark := ""
		if l.Mark > 0 {
			mark = fmt.Sprintf("%.0f", l.Mark)
		}
		fmt.Fprintf(b, "<tr><td>%s<td>%.0f<td>%.0f<td>%.3f<td>%s<td>%v</tr>", l.Name, l.Before, l.After, l.Ratio, mark, l.OK)
	}
	b.WriteString("</table><h2>Faults</h2><table><tr><th>fault<th>start<th>end</tr>")
	for _, f := range r.Faults {
		fmt.Fprintf(b, "<tr><td>%s<td>%s<td>%s</tr>", html.EscapeString(f.String()), f.Start.UTC().Format("15:04:05.0"), f.End.UTC().Format("15:04:05.0"))
	}
	b.WriteString("</table>")
	if len(r.Errors) > 0 {
		b.WriteString("<h2 class=bad>Runner errors</h2><ul>")
		for _, e := range r.Errors {
			fmt.Fprintf(b, "<li>%s", html.EscapeString(e))
		}
		b.WriteString("</ul>")
	}
	fmt.Fprintf(b, "<h2>Violations (%d)</h2><table><tr><th>rule<th>time<th>key<th>detail<th>request<th>faults active</tr>", len(r.Violations))
	for _, v := range r.Violations {
		req := ""
		if v.Request != nil {
			q := v.Request
			req = fmt.Sprintf("%s %s %s %s/%s status %d %s", q.Via, q.Region, q.Daemon, q.Policy, q.Subject, q.Status, q.Err)
		}
		fmt.Fprintf(b, "<tr class=bad><td>%s<td>%s<td>%s<td>%s<td>%s<td>%s</tr>", v.Rule, v.Time.UTC().Format("15:04:05.000"),
			html.EscapeString(v.Key), html.EscapeString(v.Detail), html.EscapeString(req), html.EscapeString(strings.Join(v.Faults, "; ")))
	}
	b.WriteString("</table>")
}

// chart draws ss as an SVG line chart over the run, with each fault as a
// shaded band.
func (r *Report) chart(title string, ss ...series) string {
	const w, h, pad = 1000.0, 220.0, 40.0
	t0, t1 := r.Started, r.Ended
	if !t1.After(t0) {
		t1 = t0.Add(time.Second)
	}
	top := 0.0
	for _, s := range ss {
		for _, y := range s.y {
			top = max(top, y)
		}
	}
	top = math.Max(top*1.1, 1)
	x := func(t time.Time) float64 { return pad + (w-2*pad)*t.Sub(t0).Seconds()/t1.Sub(t0).Seconds() }
	y := func(v float64) float64 { return h - pad + (2*pad-h)*v/top }
	var b strings.Builder
	fmt.Fprintf(&b, "<h3>%s</h3><svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f'>", html.EscapeString(title), w, h)
	for _, f := range r.Faults {
		x0, x1 := x(f.Start), x(f.End)
		fmt.Fprintf(&b, "<rect x='%.1f' y='%.0f' width='%.1f' height='%.0f' fill='#f5c6c6' opacity='0.5'><title>%s</title></rect>",
			x0, pad, math.Max(x1-x0, 1), h-2*pad, html.EscapeString(f.String()))
	}
	fmt.Fprintf(&b, "<line x1='%.0f' y1='%.0f' x2='%.0f' y2='%.0f' stroke='#000'/>", pad, h-pad, w-pad, h-pad)
	fmt.Fprintf(&b, "<line x1='%.0f' y1='%.0f' x2='%.0f' y2='%.0f' stroke='#000'/>", pad, pad, pad, h-pad)
	fmt.Fprintf(&b, "<text x='2' y='%.0f' font-size='11'>%.4g</text><text x='2' y='%.0f' font-size='11'>0</text>", pad+4, top, h-pad)
	fmt.Fprintf(&b, "<text x='%.0f' y='%.0f' font-size='11'>%s</text>", w-pad-60, h-pad+15, t1.Sub(t0).Round(time.Second))
	for i, s := range ss {
		var pts []string
		for j := range s.x {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.x[j]), y(s.y[j])))
		}
		fmt.Fprintf(&b, "<polyline fill='none' stroke='%s' stroke-width='1.2' points='%s'/>", s.color, strings.Join(pts, " "))
		fmt.Fprintf(&b, "<text x='%.0f' y='%.0f' font-size='12' fill='%s'>%s</text>", pad+10+float64(i)*130, pad-8, s.color, html.EscapeString(s.name))
	}
	b.WriteString("</svg>")
	return b.String()
}
