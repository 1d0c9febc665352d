package region

import (
	"context"
	"net/http"

	"github.com/sluice-rl/sluice/quota"
)

// The routes gateways call — POST /v1/check, POST /v1/check/batch and
// /v1/authz (with /v1/authz/<path>) — are each written once, as a route
// core: a method of Daemon that reads a dataRequest and answers through an
// http.ResponseWriter. Both servers fill the dataRequest and implement the
// writer: net/http's handlers (stdRoute, in the mux the tests and a shared
// listener use) from the *http.Request, the data-plane server straight
// from fasthttp's request (fastRoute), without converting it. The media
// type, the body limit, the problems and the panic recovery are the
// cores', written once.

// The paths of the route cores.
const (
	checkPath = "/v1/check"
	batchPath = "/v1/check/batch"
	authzPath = "/v1/authz"
	// chargePath charges a request's cost after it was served.
	chargePath = "/v1/charge"
	// authzPrefix is the path of the Envoy ext_authz form, /v1/authz/<path>.
	authzPrefix = authzPath + "/"
)

// dataRoute names a route core.
type dataRoute uint8

const (
	noRoute dataRoute = iota
	routeCheck
	routeBatch
	routeAuthz
	routeCharge
)

// serveRoute answers in by the core of route. A panic is answered as
// recoverer answers it behind the mux: the data-plane server calls the
// cores without the mux.
func (d *Daemon) serveRoute(ctx context.Context, w http.ResponseWriter, route dataRoute, in *dataRequest) {
	defer d.recovered(w, in.method, in.path)
	switch route {
	case routeCheck:
		d.check(ctx, w, in)
	case routeBatch:
		d.batch(ctx, w, in)
	case routeAuthz:
		d.authz(ctx, w, in)
	case routeCharge:
		d.charge(ctx, w, in)
	}
}

// stdRoute is the net/http handler of route's core.
func (d *Daemon) stdRoute(route dataRoute) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		in := stdData(r)
		d.serveRoute(r.Context(), w, route, &in)
	}
}

// dataRequest is what a route core reads of a request.
type dataRequest struct {
	method  string
	path    string // decoded (url.URL.Path): the instance of the route's problems
	escaped string // as sent (url.URL.EscapedPath)
	query   string // url.URL.RawQuery
	pattern string // the ServeMux pattern the request matched, "" for none
	ctype   string // the first Content-Type, "" for none
	header  http.Header
	remote  string // the peer's address, host:port
	// The body is in body when the server has read it whole (fasthttp);
	// std is net/http's request, whose body the core reads itself (within
	// the limit, so that the server closes the connection after a 413).
	body []byte
	std  *http.Request
}

// stdData is the dataRequest of a request net/http's server received.
func stdData(r *http.Request) dataRequest {
	in := dataRequest{method: r.Method, path: r.URL.Path, escaped: r.URL.EscapedPath(), query: r.URL.RawQuery,
		pattern: r.Pattern, header: r.Header, remote: r.RemoteAddr, std: r}
	if vs := r.Header["Content-Type"]; len(vs) > 0 { // Header.Get, key canonical
		in.ctype = vs[0]
	}
	return in
}

// decodeData checks the Content-Type of in, reads its body, at most limit
// bytes (a longer one is a 413 problem), and hands it to decode, which
// must not keep it. Every failure is a problem.
func decodeData(w http.ResponseWriter, in *dataRequest, limit int64, decode func([]byte) *Problem) *Problem {
	if p := checkMediaType(in.ctype); p != nil {
		return p
	}
	if in.std == nil {
		if limit = max(limit, 0); int64(len(in.body)) > limit {
			// fastWriter closes the connection after a 413, as net/http's
			// server does after http.MaxBytesReader gave up on a body.
			return tooLargeProblem(limit)
		}
		return decode(in.body)
	}
	bp, p := readBody(w, in.std, limit)
	if p != nil {
		return p
	}
	defer putBody(bp)
	return decode(*bp)
}

// identity is quota.Identify of in: it reads the headers and the peer's
// address, nothing else of the request.
func (d *Daemon) identity(in *dataRequest) (quota.Identity, error) {
	r := http.Request{Header: in.header, RemoteAddr: in.remote}
	return quota.Identify(&r, d.ident)
}
