package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestDevGossipLoopbackOnly: --dev gossip is unauthenticated, so it binds to
// loopback by default and refuses any other address in one line.
func TestDevGossipLoopbackOnly(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantListen string
		wantErr    string
	}{
		{"dev defaults to loopback", []string{"--region", "eu", "--node", "n1", "--dev"}, "127.0.0.1:7946", ""},
		{"dev on loopback", []string{"--region", "eu", "--node", "n1", "--dev", "--gossip-listen", "127.0.0.1:0"}, "127.0.0.1:0", ""},
		{"dev on ::1", []string{"--region", "eu", "--node", "n1", "--dev", "--gossip-listen", "[::1]:7000"}, "[::1]:7000", ""},
		{"dev on localhost", []string{"--region", "eu", "--node", "n1", "--dev", "--gossip-listen", "localhost:7000"}, "localhost:7000", ""},
		{"dev on every interface", []string{"--region", "eu", "--node", "n1", "--dev", "--gossip-listen", "0.0.0.0:7946"}, "", "--dev gossip is unauthenticated and binds to loopback only"},
		{"dev on an empty host", []string{"--region", "eu", "--node", "n1", "--dev", "--gossip-listen", ":7946"}, "", "--dev gossip is unauthenticated and binds to loopback only"},
		{"dev on a LAN address", []string{"--region", "eu", "--node", "n1", "--dev", "--gossip-listen", "10.0.0.5:7946"}, "", "--dev gossip is unauthenticated and binds to loopback only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m multiRegionFlags
			fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			m.register(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			gc, err := m.config(fs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("config(%v) = %v, want a one-line error containing %q", tt.args, err, tt.wantErr)
				}
				return
			}
			if err != nil || gc.Listen != tt.wantListen || !gc.Dev {
				t.Fatalf("config(%v) = %+v, %v; want listen %s", tt.args, gc, err, tt.wantListen)
			}
		})
	}
}
