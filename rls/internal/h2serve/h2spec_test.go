package h2serve

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

	"github.com/sluice-rl/sluice/internal/testtools"
)

// h2specVersion is the h2spec the conformance test builds.
const h2specVersion = "v2.2.1+incompatible"

// h2specKnown are the h2spec cases (their section and number, as h2spec
// names them) the transport fails, each with the reason it
// is left so; docs/architecture.md lists them too. Any other failing
// case fails TestH2Spec.
var h2specKnown = map[string]string{
	// A request that is not a gRPC call (h2spec sends GET without
	// content-type) is answered as gRPC answers any failed call, with
	// trailers only: no DATA frame, which these cases wait for.
	"generic/2/2": notGRPC, "generic/2/3": notGRPC, "generic/4/4": notGRPC,
	// Every call is answered as soon as it is read, so that h2spec's
	// streams never stay open together past SETTINGS_MAX_CONCURRENT_STREAMS;
	// a stream past it is refused (TestTransportRapidReset).
	"http2/5.1.2/1": "calls are answered before the stream limit is reached",
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
}

// Reasons shared by several h2specKnown cases.
const (
	notGRPC = "a request that is not a gRPC call is answered with trailers only"
	headers = "headers are not validated as an HTTP request"
)

// h2specBin returns an h2spec binary, built once into the tools directory
// with go install from the Go module proxy.
func h2specBin(t *testing.T) string {
	t.Helper()
	p, err := testtools.Install(t, "h2spec@"+strings.TrimSuffix(h2specVersion, "+incompatible"), "github.com/summerwind/h2spec/cmd/h2spec",
		h2specVersion, "h2spec", "GOFLAGS=-buildvcs=false")
	if err != nil {
		t.Fatal(err)
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

// TestH2Spec runs the h2spec conformance suite against the transport,
// every request a call of Paths[0] (-P). h2spec waits for
// its SETTINGS to be acknowledged before its first request, which the
// transport does only once that request shows the connection is a
// proxy's (a connection handed to grpc-go must not have had an ack):
// here every connection is the transport's from its preface on
// (Config.OwnAll). A failing case not in h2specKnown fails the test.
func TestH2Spec(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs h2spec; skipped under -short")
	}
	bin := h2specBin(t)
	s, _ := transportServer(t, Config{OwnAll: true}, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		ln.Close()
		s.GoAway()
		cancel()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve = %v, want net.ErrClosed", err)
		}
		s.Wait()
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
