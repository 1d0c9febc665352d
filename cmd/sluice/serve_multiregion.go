package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/sluice-rl/sluice/gossip"
	"github.com/sluice-rl/sluice/region"
)

// multiRegionFlags are the flags of `sluice serve` that make a daemon a
// node of a multi-region cluster.
type multiRegionFlags struct {
	region, node, listen, advertise, keyFile, preset string
	join                                             []string
	interval                                         time.Duration
	dev                                              bool
	// localDaemons is --local-daemons: single-region only.
	localDaemons int
}

func (m *multiRegionFlags) register(f *pflag.FlagSet) {
	f.StringVar(&m.region, "region", "", "region this daemon serves; enables multi-region mode (gossip, global shares, policy sync)")
	f.StringVar(&m.node, "node", "", "stable node id in the cluster (default: the hostname)")
	f.StringVar(&m.listen, "gossip-listen", "0.0.0.0:7946", "memberlist address HOST:PORT (UDP and TCP)")
	f.StringVar(&m.advertise, "gossip-advertise", "", "HOST:PORT other nodes dial, if not --gossip-listen's")
	f.StringSliceVar(&m.join, "join", nil, "comma-separated HOST:PORT of cluster members to join")
	f.DurationVar(&m.interval, "gossip-interval", gossip.DefaultInterval, "usage report interval; every region must use the same")
	f.StringVar(&m.keyFile, "gossip-key-file", "", "file holding the gossip AES key: 16, 24 or 32 bytes, raw or base64 (required unless --dev)")
	f.StringVar(&m.preset, "gossip-preset", gossip.PresetLAN, "memberlist timings: lan, wan (regions across the world) or local (loopback tests)")
	f.IntVar(&m.localDaemons, "local-daemons", 1, "single-region: how many daemons share the store; while it is down each admits 1/N of an on_store_failure=local policy's rate (with --region the live daemons of the region are counted instead)")
	f.BoolVar(&m.dev, "dev", false, "development mode: unencrypted, unauthenticated gossip without --gossip-key-file, bound to loopback only (--gossip-listen defaults to 127.0.0.1:7946 and must be a loopback address)")
}

// config returns the daemon's GossipConfig, nil without --region.
func (m *multiRegionFlags) config(fs *pflag.FlagSet) (*region.GossipConfig, error) {
	if m.localDaemons < 1 {
		return nil, fmt.Errorf("--local-daemons %d: must be at least 1", m.localDaemons)
	}
	if m.region != "" && m.localDaemons != 1 {
		return nil, errors.New("--local-daemons is for single-region mode: with --region the live daemons of the region are counted")
	}
	if m.region == "" {
		for _, name := range []string{"node", "gossip-listen", "gossip-advertise", "join", "gossip-interval", "gossip-key-file", "gossip-preset"} {
			if fs.Changed(name) {
				return nil, fmt.Errorf("--%s needs --region (multi-region mode)", name)
			}
		}
		return nil, nil
	}
	node := m.node
	if node == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return nil, errors.New("--node: the hostname is unknown; name the node")
		}
		node = h
	}
	for _, pair := range [][2]string{{"region", m.region}, {"node", node}} {
		if len(pair[1]) > 128 || strings.ContainsAny(pair[1], " \t\r\n") {
			return nil, fmt.Errorf("--%s %q: at most 128 bytes, no spaces", pair[0], pair[1])
		}
	}
	listen := m.listen
	if m.dev && !fs.Changed("gossip-listen") {
		listen = "127.0.0.1:7946"
	}
	if err := checkHostPort("--gossip-listen", listen, true); err != nil {
		return nil, err
	}
	if host, _, _ := net.SplitHostPort(listen); m.dev && !gossip.IsLoopback(host) {
		return nil, fmt.Errorf("--gossip-listen %q: --dev gossip is unauthenticated and binds to loopback only (127.0.0.1, ::1 or localhost)", listen)
	}
	if m.advertise != "" {
		if err := checkHostPort("--gossip-advertise", m.advertise, false); err != nil {
			return nil, err
		}
	}
	var join []string
	for _, j := range m.join {
		j = strings.TrimSpace(j)
		if j == "" {
			continue
		}
		if err := checkHostPort("--join", j, false); err != nil {
			return nil, err
		}
		join = append(join, j)
	}
	if m.interval < 100*time.Millisecond {
		return nil, fmt.Errorf("--gossip-interval %v: must be at least 100ms", m.interval)
	}
	switch m.preset {
	case gossip.PresetLAN, gossip.PresetWAN, gossip.PresetLocal:
	default:
		return nil, fmt.Errorf("--gossip-preset %q: want lan, wan or local", m.preset)
	}
	gc := &region.GossipConfig{Region: m.region, Node: node, Listen: listen, Advertise: m.advertise, Join: join,
		Interval: m.interval, Dev: m.dev, Preset: m.preset}
	if m.keyFile != "" {
		key, err := readGossipKey(m.keyFile)
		if err != nil {
			return nil, err
		}
		gc.SecretKey = key
	} else if !m.dev {
		return nil, errors.New("--gossip-key-file is required with --region (or --dev for unencrypted gossip)")
	}
	return gc, nil
}

// localCount is region.Config.LocalDaemons: --local-daemons, or 0 with
// --region (the membership is counted).
func (m *multiRegionFlags) localCount() int {
	if m.region != "" {
		return 0
	}
	return m.localDaemons
}

func checkHostPort(flag, s string, allowZero bool) error {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%s %q: want HOST:PORT", flag, s)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 || (port == 0 && !allowZero) {
		return fmt.Errorf("%s %q: bad port", flag, s)
	}
	if host == "" && !allowZero {
		return fmt.Errorf("%s %q: want HOST:PORT", flag, s)
	}
	return nil
}

// readGossipKey reads an AES key: the file's trimmed content as base64 if
// it decodes to 16, 24 or 32 bytes, else the raw bytes if that is their
// length.
func readGossipKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--gossip-key-file: %w", err)
	}
	s := strings.TrimSpace(string(b))
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if k, err := enc.DecodeString(s); err == nil && validKeyLen(len(k)) {
			return k, nil
		}
	}
	if validKeyLen(len(b)) {
		return b, nil
	}
	if validKeyLen(len(s)) {
		return []byte(s), nil
	}
	return nil, fmt.Errorf("--gossip-key-file %s: want an AES key of 16, 24 or 32 bytes, raw or base64 (e.g. head -c 32 /dev/urandom | base64)", path)
}

func validKeyLen(n int) bool { return n == 16 || n == 24 || n == 32 }
