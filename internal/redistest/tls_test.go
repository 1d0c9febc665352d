package redistest_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestTLSServer starts a server on TLS only, with a password: a client of
// the test's CA and certificate reaches it, one without TLS does not.
func TestTLSServer(t *testing.T) {
	c := redistest.NewTLS(t)
	s := redistest.Start(t, redistest.WithTLS(c), redistest.WithAuth("sluice", "s3cret"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Client(t).Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET over TLS: %v", err)
	}
}

// TestTLSCluster forms a 3-primary Cluster on TLS only, with tls-cluster.
func TestTLSCluster(t *testing.T) {
	c := redistest.NewTLS(t)
	cl := redistest.StartCluster(t, 3, 0, redistest.WithTLS(c))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc := cl.Client(t)
	for _, k := range []string{"a", "b", "c", "d"} {
		if err := cc.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatalf("SET %s over TLS: %v", k, err)
		}
	}
}

// TestTLSSentinel forms a Sentinel deployment on TLS only, with ACL users
// on the data nodes and the Sentinels.
func TestTLSSentinel(t *testing.T) {
	c := redistest.NewTLS(t)
	sd := redistest.StartSentinel(t, redistest.WithTLS(c), redistest.WithAuth("app", "datapw"), redistest.WithSentinelAuth("sent", "sentpw"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := sd.Client(t).Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the Sentinels over TLS: %v", err)
	}
}
