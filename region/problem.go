package region

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/quota"
)

// Header values shared by every answer: assigning one of these slices to a
// header key replaces that key's values without allocating. No code may
// write into them (Header.Set and Header.Add never do: they replace or
// grow the slice).
var (
	hdrJSON    = []string{"application/json"}
	hdrProblem = []string{"application/problem+json"}
	hdrNoStore = []string{"no-store"}
)

// writeProblem writes p as application/problem+json. The instance is the
// request path unless p names one.
func writeProblem(w http.ResponseWriter, r *http.Request, p *Problem) {
	if p.Instance == "" && r != nil {
		p.Instance = r.URL.Path
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	bp := bodyBufs.Get().(*[]byte)
	defer putBody(bp)
	body, ok := appendProblem((*bp)[:0], p)
	*bp = body
	if !ok {
		var err error
		if body, err = json.Marshal(p); err != nil { // cannot happen: every member is a plain value
			body = []byte(`{"type":"` + ProblemInternal + `","title":"Internal Server Error","status":500}`)
			p.Status = http.StatusInternalServerError
		}
	}
	h := w.Header()
	h["Content-Type"] = hdrProblem
	if p.Status == http.StatusTooManyRequests {
		h["Cache-Control"] = hdrNoStore // RFC 6585: 429 must not be stored
	}
	writeBody(w, p.Status, append(body, '\n'))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	if d, ok := v.(Decision); ok {
		writeDecision(w, status, &d)
		return
	}
	body, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, nil, newProblem(http.StatusInternalServerError, ProblemInternal, "encoding the response failed"))
		return
	}
	w.Header()["Content-Type"] = hdrJSON
	writeBody(w, status, append(body, '\n'))
}

// writeDecision is writeJSON for the body of a check; a *Decision is not
// copied into an interface value, which saves an allocation per check.
func writeDecision(w http.ResponseWriter, status int, d *Decision) {
	bp := bodyBufs.Get().(*[]byte)
	defer putBody(bp) // Write keeps no reference to its argument (io.Writer)
	body, ok := appendDecision((*bp)[:0], d)
	*bp = body
	if !ok {
		// A copy, so that d itself does not escape to the heap on the
		// common path.
		b, err := json.Marshal(*d)
		if err != nil {
			writeProblem(w, nil, newProblem(http.StatusInternalServerError, ProblemInternal, "encoding the response failed"))
			return
		}
		body = b
	}
	w.Header()["Content-Type"] = hdrJSON
	writeBody(w, status, append(body, '\n'))
}

// chunkingThreshold is the size below which net/http buffers a whole
// answer and sets its Content-Length itself (the server's
// bufferBeforeChunkingSize): a body written at once and smaller than this
// needs no header of ours, which saves formatting it on every check.
const chunkingThreshold = 2048

// writeBody writes the status and body, with a Content-Length when the
// server would not set it.
func writeBody(w http.ResponseWriter, status int, body []byte) {
	if len(body) >= chunkingThreshold {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	w.Write(body)
}

// The problem types and the problem document are package decide's, shared
// by every front end of the decision.
const (
	ProblemQuotaExceeded   = decide.ProblemQuotaExceeded
	ProblemReducedCapacity = decide.ProblemReducedCapacity
	ProblemAbnormalUsage   = decide.ProblemAbnormalUsage
	ProblemInvalid         = decide.ProblemInvalid
	ProblemUnauthorized    = decide.ProblemUnauthorized
	ProblemForbidden       = decide.ProblemForbidden
	ProblemNotFound        = decide.ProblemNotFound
	ProblemConflict        = decide.ProblemConflict
	ProblemPrecondition    = decide.ProblemPrecondition
	ProblemTooLarge        = decide.ProblemTooLarge
	ProblemMethod          = decide.ProblemMethod
	ProblemUnavailable     = decide.ProblemUnavailable
	ProblemStateStore      = decide.ProblemStateStore
	ProblemInternal        = decide.ProblemInternal
)

// Problem is an RFC 9457 problem details object (decide.Problem).
type Problem = decide.Problem

// newProblem is decide.NewProblem.
func newProblem(status int, typ, detail string, errs ...quota.FieldError) *Problem {
	return decide.NewProblem(status, typ, detail, errs...)
}

// invalid is decide.Invalid: a 400 problem naming field.
func invalid(field, format string, args ...any) *Problem {
	return decide.Invalid(field, format, args...)
}
