package rls

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/region"
)

// h2specVersion is the h2spec the conformance test builds.
const h2specVersion = "v2.2.1+incompatible"

// h2specKnown are the h2spec cases (their section and number, as h2spec
// names them) the service's own transport fails, each with the reason it
// is left so; docs/architecture.md lists them too. Any other failing
// case fails TestH2Spec.
var h2specKnown = map[string]string{
	// A request that is not a gRPC call (h2spec sends GET without
	// content-type) is answered as gRPC answers any failed call, with
	// trailers only: no DATA frame, which these cases wait for.
	"generic/2/2": notGRPC, "generic/2/3": notGRPC, "generic/4/4": notGRPC,
	// Frames on a stream that is idle, half-closed (remote) or closed are
	// discarded (their bytes given back to the window), not answered
	// with a stream or connection error: a proxy's resets race with the
	// answers, and a discarded frame holds nothing.
	"http2/5.1/1": streamState, "http2/5.1/2": streamState, "http2/5.1/3": streamState,
	"http2/5.1/5": streamState, "http2/5.1/8": streamState, "http2/5.1/11": streamState,
	"http2/6.1/2": streamState, "http2/6.4/2": streamState,
	// Every call is answered as soon as it is read, so that h2spec's
	// streams never stay open together past SETTINGS_MAX_CONCURRENT_STREAMS;
	// a stream past it is refused (TestTransportRapidReset).
	"http2/5.1.2/1": "calls are answered before the stream limit is reached",
	// PRIORITY is ignored (RFC 9113 deprecates the scheme), self-dependency
	// included.
	"http2/5.3.1/1": priority, "http2/5.3.1/2": priority,
	// The header list is read for :path, content-type, grpc-encoding and
	// grpc-timeout only; it is decoded and bounded but not validated as
	// an HTTP request (pseudo-headers, letter case, connection-specific
	// fields, content-length), and a malformed one is answered with a
	// gRPC status instead of a PROTOCOL_ERROR reset.
	"http2/8.1.2/1": headers, "http2/8.1.2.1/1": headers, "http2/8.1.2.1/2": headers, "http2/8.1.2.1/4": headers,
	"http2/8.1.2.2/1": headers, "http2/8.1.2.2/2": headers,
	"http2/8.1.2.3/1": headers, "http2/8.1.2.3/2": headers, "http2/8.1.2.3/3": headers, "http2/8.1.2.3/4": headers,
	"http2/8.1.2.3/5": headers, "http2/8.1.2.3/6": headers, "http2/8.1.2.3/7": headers,
	"http2/8.1.2.6/1": headers, "http2/8.1.2.6/2": headers,
	// A PUSH_PROMISE from a client is ignored, as an unknown frame is,
	// not a connection error.
	"http2/8.2/1": "a PUSH_PROMISE from the client is ignored",
	// Passes or fails by timing: the transport closes the connection as
	// soon as the peer's GOAWAY is read, and when h2spec's PING after it is
	// already in the receive buffer the kernel answers the close with RST
	// rather than FIN, which h2spec reads as a reset. A lingering close
	// (half-close, then drain briefly) would pass it always.
	"http2/7/1": "the connection closes at once on a peer's GOAWAY; a PING already received makes it a reset",
}

// Reasons shared by several h2specKnown cases.
const (
	notGRPC     = "a request that is not a gRPC call is answered with trailers only"
	streamState = "frames on idle or closed streams are discarded, not errors"
	priority    = "PRIORITY is ignored"
	headers     = "headers are not validated as an HTTP request"
)

// toolsDir is where tools built for the tests are kept (SLUICE_TOOLS, as
// for make bench-peers).
func toolsDir(t *testing.T) string {
	if d := os.Getenv("SLUICE_TOOLS"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(home, ".cache", "sluice-tools")
}

// h2specBin returns an h2spec binary, built once into the tools directory
// with go install from the Go module proxy.
func h2specBin(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(toolsDir(t), "h2spec@"+strings.TrimSuffix(h2specVersion, "+incompatible"))
	p := filepath.Join(dir, "h2spec")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	t.Logf("building h2spec %s into %s (go install)", h2specVersion, dir)
	cmd := exec.Command("go", "install", "github.com/summerwind/h2spec/cmd/h2spec@"+h2specVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install github.com/summerwind/h2spec/cmd/h2spec@%s: %v\n%s", h2specVersion, err, out)
	}
	return p
}

// xmlControl is a character reference to a control character, which XML
// 1.0 forbids.
var xmlControl = regexp.MustCompile(`&#(x0*[0-1]?[0-9a-fA-F]|0*[0-9]|0*[12][0-9]|0*3[01]);`)

// xmlText makes h2spec's report parseable: a failure message quotes the
// bytes the server sent, NUL and other control characters included,
// either raw or as character references, which XML 1.0 forbids. They are
// replaced by U+FFFD; tab, newline and carriage return are kept.
func xmlText(raw []byte) []byte {
	raw = bytes.Map(func(r rune) rune {
		if r < 0x20 && r != '\t' && r != '\n' && r != '\r' {
			return '\uFFFD'
		}
		return r
	}, raw)
	return xmlControl.ReplaceAllFunc(raw, func(ref []byte) []byte {
		switch string(ref) {
		case "&#9;", "&#10;", "&#13;", "&#x9;", "&#xA;", "&#xa;", "&#xD;", "&#xd;":
			return ref
		}
		return []byte("\uFFFD")
	})
}

// junitSuites is what TestH2Spec reads of h2spec's JUnit report.
type junitSuites struct {
	Suites []struct {
		Package string `xml:"package,attr"`
		Name    string `xml:"name,attr"`
		Cases   []struct {
			Package string    `xml:"package,attr"`
			Name    string    `xml:"name,attr"`
			Failure *struct{} `xml:"failure"`
			Error   *struct{} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// TestH2Spec runs the h2spec conformance suite against the service's own
// transport, every request a ShouldRateLimit call (-P). h2spec waits for
// its SETTINGS to be acknowledged before its first request, which the
// transport does only once that request shows the connection is a
// proxy's (a connection handed to grpc-go must not have had an ack):
// here every connection is the transport's from its preface on
// (Server.ownAll). A failing case not in h2specKnown fails the test.
func TestH2Spec(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs h2spec; skipped under -short")
	}
	bin := h2specBin(t)
	ctx, cancel := context.WithCancel(context.Background())
	rcfg := region.DefaultConfig()
	rcfg.Policies = testPolicies
	d, err := region.New(ctx, rcfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Decider: d, Matcher: d.Registry(), ShutdownTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.ownAll = true
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	report := filepath.Join(t.TempDir(), "h2spec.xml")
	// -o: each case's timeout, in seconds, generous for a loaded machine;
	// h2specKnown's cases that time out take it.
	out, err := exec.Command(bin, "-h", "127.0.0.1", "-p", port, "-P", pathShouldRateLimit, "-o", "5", "-j", report).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("h2spec: %v\n%s", err, out)
	}
	raw, rerr := os.ReadFile(report)
	if rerr != nil {
		t.Fatalf("h2spec wrote no report (%v): %v\n%s", err, rerr, out)
	}
	var js junitSuites
	if err := xml.Unmarshal(xmlText(raw), &js); err != nil {
		t.Fatalf("h2spec's report: %v", err)
	}
	var failed, unexpected []string
	n := 0
	for _, su := range js.Suites {
		for i, c := range su.Cases {
			n++
			if c.Failure == nil && c.Error == nil {
				continue
			}
			id := c.Package + "/" + strconv.Itoa(i+1)
			failed = append(failed, id)
			if _, ok := h2specKnown[id]; !ok {
				unexpected = append(unexpected, id+" ("+su.Name+": "+c.Name+")")
			}
		}
	}
	sort.Strings(unexpected)
	t.Logf("h2spec: %d cases, %d failed: %v", n, len(failed), failed)
	if n == 0 {
		t.Fatalf("h2spec ran no case:\n%s", out)
	}
	if len(unexpected) > 0 {
		t.Errorf("h2spec cases failed that h2specKnown does not list:\n%s\n\nh2spec's output:\n%s", strings.Join(unexpected, "\n"), out)
	}
}

// TestXMLText holds xmlText to making a report with control characters,
// raw or referenced, parseable while keeping the whitespace XML allows.
func TestXMLText(t *testing.T) {
	tests := []struct{ in, want string }{
		{"<a>x\x00y</a>", "x\uFFFDy"},
		{"<a>x&#0;y&#x1F;z&#31;</a>", "x\uFFFDy\uFFFDz\uFFFD"},
		{"<a>t&#9;n&#10;r&#13;&#x20;&#32;&#65;</a>", "t\tn\nr\r  A"},
	}
	for _, tt := range tests {
		var v struct {
			Text string `xml:",chardata"`
		}
		if err := xml.Unmarshal(xmlText([]byte(tt.in)), &v); err != nil || v.Text != tt.want {
			t.Errorf("xmlText(%q) parses to %q, %v; want %q", tt.in, v.Text, err, tt.want)
		}
	}
}
