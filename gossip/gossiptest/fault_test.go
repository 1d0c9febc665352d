package gossiptest

import (
	"io"
	"testing"

	"github.com/hashicorp/memberlist"
)

// TestFaultNetSendsUncompressed checks that a node on a FaultNet turns off
// memberlist's packet compression (see FaultNet).
func TestFaultNetSendsUncompressed(t *testing.T) {
	mc := memberlist.DefaultLocalConfig()
	mc.BindAddr, mc.BindPort = "127.0.0.1", 0
	mc.LogOutput = io.Discard
	if !mc.EnableCompression {
		t.Fatal("memberlist's local preset no longer compresses: this test checks nothing")
	}
	if err := NewFaultNet(1).Attach("r0")(mc); err != nil {
		t.Fatal(err)
	}
	defer mc.Transport.Shutdown()
	if mc.EnableCompression {
		t.Error("attach left EnableCompression on")
	}
}
