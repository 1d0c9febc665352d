package region

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// The data-plane listener, where gateways ask once per request, is served
// by fasthttp. net/http's server spends, on every request, a goroutine and
// extra read syscalls watching whether the client went away, which costs
// more than deciding the request itself; fasthttp serves a keep-alive
// connection with one read and one write per request. The routes gateways
// call are route cores (route.go), which fastRoute feeds straight from
// fasthttp's request. The other routes (health, readiness, metrics, the
// admin API when it shares the listener, and the mux's 404, 405 and
// redirects) are rare on this listener and stay net/http handlers, shared
// with the admin listener: such a request is converted to an *http.Request
// (every string copied, so that nothing a handler keeps points into
// fasthttp's reused buffers). Every answer is written through fastWriter,
// an http.ResponseWriter.

// fastServer serves h on the data-plane listener with the limits of
// httpServer: header size, read and idle timeouts.
func (d *Daemon) fastServer(h http.Handler) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:      d.fastHandler(h),
		ErrorHandler: d.fastError,
		ReadTimeout:  30 * time.Second,
		IdleTimeout:  IdleTimeout,
		// The request line and headers must fit the read buffer, as
		// net/http's MaxHeaderBytes bounds them.
		ReadBufferSize: 64 << 10,
		// fasthttp reads a body whole before the handler runs. Bodies past
		// MaxBodyBytes are refused by the handlers with their problem and
		// the connection closed; up to four times that is read so that the
		// client, still writing, gets the answer instead of a reset, and
		// beyond it fastError answers at once.
		MaxRequestBodySize:    int(max(4*d.cfg.MaxBodyBytes, 64<<10)),
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		// Paths reach the handlers as the client wrote them, as with
		// net/http: ServeMux redirects unclean paths, and /v1/authz/<path>
		// limits the path it was given.
		DisablePreParseMultipartForm: true,
		Logger:                       fastLogger{d},
		CloseOnShutdown:              true,
	}
}

// fastLogger sends fasthttp's own messages (connection errors) to the
// daemon's log at warning level, as httpServer's ErrorLog does.
type fastLogger struct{ d *Daemon }

func (l fastLogger) Printf(format string, args ...any) {
	l.d.log.Warn("http server", "msg", fmt.Sprintf(format, args...))
}

// fastError answers a request fasthttp could not read as a problem, as the
// handlers answer theirs; fasthttp closes the connection after it.
func (d *Daemon) fastError(ctx *fasthttp.RequestCtx, err error) {
	p := newProblem(http.StatusBadRequest, ProblemInvalid, "malformed HTTP request")
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		p = newProblem(http.StatusRequestEntityTooLarge, ProblemTooLarge, fmt.Sprintf("the body must be at most %d bytes", d.cfg.MaxBodyBytes))
	case errors.As(err, &small):
		p = newProblem(http.StatusRequestHeaderFieldsTooLarge, ProblemInvalid, "the request headers are too large")
	case isTimeout(err):
		p = newProblem(http.StatusRequestTimeout, ProblemInvalid, "the request was not read in time")
	}
	w := &fastWriter{ctx: ctx, header: http.Header{}}
	writeProblem(w, nil, p)
	ctx.SetConnectionClose()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// fastHandler serves each request for h, the data-plane mux: by its route
// core when fastRoute finds one, else converted for h.
func (d *Daemon) fastHandler(h http.Handler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		w := writers.Get().(*fastWriter)
		w.ctx = ctx
		var in dataRequest
		if route := fastRoute(ctx, &in); route != noRoute {
			d.serveRoute(context.Background(), w, route, &in)
		} else if r, err := stdRequest(ctx); err != nil {
			writeProblem(w, nil, newProblem(http.StatusBadRequest, ProblemInvalid, "malformed request target"))
		} else {
			h.ServeHTTP(w, r)
		}
		if w.status == 0 {
			w.WriteHeader(http.StatusOK)
		}
		w.reset()
		writers.Put(w)
	}
}

var writers = sync.Pool{New: func() any { return &fastWriter{header: http.Header{}} }}

// fastRoutes are the requests fastRoute answers by their path as sent:
// the mux routes them by pattern, and their path is clean, the same
// escaped or not, and not under authzPrefix.
var fastRoutes = [...]struct {
	method, path, pattern string
	route                 dataRoute
}{
	{http.MethodPost, checkPath, "POST " + checkPath, routeCheck},
	{http.MethodPost, batchPath, "POST " + batchPath, routeBatch},
	{http.MethodPost, chargePath, "POST " + chargePath, routeCharge},
	{http.MethodGet, authzPath, "GET " + authzPath, routeAuthz},
	{http.MethodHead, authzPath, "GET " + authzPath, routeAuthz}, // a GET pattern matches HEAD
	{http.MethodPost, authzPath, "POST " + authzPath, routeAuthz},
}

// fastRoute finds the route core of the request in ctx and fills in for
// it as stdData would from the *http.Request that stdRequest converts it
// to; it is noRoute for a request the data-plane mux would not route to
// a core, or whose target stdRequest would refuse. Only the target's
// origin form is routed here (the absolute form goes to the mux).
func fastRoute(ctx *fasthttp.RequestCtx, in *dataRequest) dataRoute {
	target := ctx.RequestURI()
	path, query, _ := bytes.Cut(target, []byte{'?'})
	method := ctx.Method()
	route := noRoute
	for _, r := range &fastRoutes {
		if string(path) == r.path && string(method) == r.method {
			route, in.method, in.path, in.escaped, in.pattern = r.route, r.method, r.path, r.path, r.pattern
			break
		}
	}
	switch {
	case route != noRoute:
		if hasCTL(target) { // url.ParseRequestURI's only refusal of such a target
			return noRoute
		}
		in.query = string(query)
	case bytes.HasPrefix(path, []byte(authzPrefix)):
		// authzPrefixed serves these before the mux, by the escaped path.
		u, err := url.ParseRequestURI(string(target))
		if err != nil {
			return noRoute
		}
		if in.escaped = u.EscapedPath(); !strings.HasPrefix(in.escaped, authzPrefix) {
			return noRoute
		}
		route, in.method, in.path, in.query, in.pattern = routeAuthz, fastMethod(method), u.Path, u.RawQuery, authzPrefix+"{path...}"
	default:
		return noRoute
	}
	if route == routeAuthz {
		in.header, in.remote = stdHeader(&ctx.Request.Header), ctx.RemoteAddr().String()
	} else {
		in.ctype, in.body = fastContentType(&ctx.Request.Header), ctx.PostBody()
	}
	return route
}

// hasCTL reports whether b holds an ASCII control byte.
func hasCTL(b []byte) bool {
	for _, c := range b {
		if c < ' ' || c == 0x7f {
			return true
		}
	}
	return false
}

// fastContentType is the first Content-Type of a request, "" for none.
func fastContentType(h *fasthttp.RequestHeader) string {
	if all := contentTypes(h); len(all) > 0 {
		return all[0]
	}
	return string(h.ContentType())
}

// fastMethod is the method m names, not copied for the common ones.
func fastMethod(m []byte) string {
	switch string(m) {
	case http.MethodGet:
		return http.MethodGet
	case http.MethodPost:
		return http.MethodPost
	case http.MethodHead:
		return http.MethodHead
	}
	return string(m)
}

// stdRequest is the *http.Request net/http's server would hand a handler
// for the request in ctx: the method, the target as sent (RequestURI and
// its parsed URL), Host apart from the header, the other headers in their
// canonical form, the body, the peer's address.
func stdRequest(ctx *fasthttp.RequestCtx) (*http.Request, error) {
	uri := string(ctx.RequestURI())
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return nil, err
	}
	body := ctx.PostBody()
	r := &http.Request{
		Method:        fastMethod(ctx.Method()),
		URL:           u,
		RequestURI:    uri,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        stdHeader(&ctx.Request.Header),
		Host:          string(ctx.Host()),
		RemoteAddr:    ctx.RemoteAddr().String(),
		ContentLength: int64(len(body)),
		Body:          http.NoBody,
	}
	if !ctx.Request.Header.IsHTTP11() {
		r.Proto, r.ProtoMinor = "HTTP/1.0", 0
	}
	if len(body) > 0 {
		rb := new(bodyReader)
		rb.Reset(body)
		r.Body = rb
	}
	return r, nil // a nil context is context.Background
}

// stdHeader is h as net/http's server would hand it to a handler: every
// header but Host and Transfer-Encoding (r.Host; the body arrives
// de-chunked), keys in canonical form, values in the order sent.
func stdHeader(h *fasthttp.RequestHeader) http.Header {
	out := make(http.Header, 4)
	// One backing array for the values of headers seen once, and the
	// common names without a copy: most requests then cost no allocation
	// per header beyond its value.
	vals := make([]string, 0, h.Len())
	for k, v := range h.All() {
		key, ok := headerNames[string(k)]
		if !ok {
			key = string(k)
		}
		switch key {
		case "Host", "Transfer-Encoding":
			continue
		}
		if prev, ok := out[key]; ok {
			out[key] = append(prev[:len(prev):len(prev)], string(v))
			continue
		}
		vals = append(vals, string(v))
		out[key] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	if all := contentTypes(h); len(all) > 1 {
		out["Content-Type"] = all
	}
	return out
}

// contentTypes is every Content-Type of a request, in the order sent, if
// it names more than one. fasthttp keeps only the last of a repeated
// Content-Type, where net/http keeps them all and the handlers read the
// first, so such a request is read again from its raw headers.
func contentTypes(h *fasthttp.RequestHeader) []string {
	raw := h.RawHeaders()
	if headerLines(raw, nil) < 2 {
		return nil
	}
	var out []string
	headerLines(raw, func(v []byte) { out = append(out, string(v)) })
	return out
}

// headerLines counts the lines of raw that name Content-Type, in any case,
// handing each one's value to each if it is not nil.
func headerLines(raw []byte, each func(v []byte)) int {
	n := 0
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if len(line) == 0 || line[0]|0x20 != 'c' { // most lines are told apart by their first byte
			continue
		}
		if k, v, ok := bytes.Cut(line, []byte{':'}); ok && bytes.EqualFold(k, []byte("Content-Type")) {
			n++
			if each != nil {
				each(bytes.TrimSpace(v))
			}
		}
	}
	return n
}

// bodyReader is a request body read from fasthttp's buffer.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// headerNames are the header names gateways commonly send, in canonical
// form, so that converting them copies nothing.
var headerNames = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Accept", "Accept-Encoding", "Authorization", "Connection", "Content-Length",
		"Content-Type", "Cookie", "Forwarded", "Host", "Transfer-Encoding", "User-Agent", "X-Api-Key",
		"X-Envoy-Expected-Rq-Timeout-Ms", "X-Envoy-Internal", "X-Forwarded-For", "X-Forwarded-Host",
		"X-Forwarded-Method", "X-Forwarded-Proto", "X-Forwarded-Uri", "X-Original-Method", "X-Original-Uri",
		"X-Original-Url", "X-Real-Ip", "X-Request-Id", "X-Sluice-Tier"} {
		m[k] = k
	}
	return m
}()

// fastWriter is the http.ResponseWriter of a converted request: headers
// go to fasthttp's response at WriteHeader, the body into its buffer.
type fastWriter struct {
	ctx    *fasthttp.RequestCtx
	header http.Header
	status int
	wrote  bool
}

func (w *fastWriter) Header() http.Header { return w.header }

func (w *fastWriter) WriteHeader(code int) {
	if w.status != 0 {
		return
	}
	w.status = code
	if code == http.StatusRequestEntityTooLarge {
		// As net/http does after http.MaxBytesReader gave up on a body.
		w.ctx.SetConnectionClose()
	}
	rh := &w.ctx.Response.Header
	for k, vs := range w.header {
		switch k {
		case "Content-Length":
			continue // fasthttp counts the body it sends
		case "Connection":
			if len(vs) > 0 && strings.EqualFold(vs[0], "close") {
				w.ctx.SetConnectionClose()
			}
			continue
		}
		for _, v := range vs {
			rh.Add(k, v)
		}
	}
	w.ctx.SetStatusCode(code)
}

func (w *fastWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.wrote && len(b) > 0 {
		w.wrote = true
		if len(w.ctx.Response.Header.ContentType()) == 0 {
			w.ctx.Response.Header.SetContentType(http.DetectContentType(b))
		}
	}
	return w.ctx.Write(b)
}

func (w *fastWriter) reset() {
	clear(w.header)
	w.ctx, w.status, w.wrote = nil, 0, false
}
