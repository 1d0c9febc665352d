package gossip

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// Presets name memberlist's timing profiles.
const (
	PresetLAN   = "lan"   // memberlist.DefaultLANConfig: probe 1 s, suspicion ×4
	PresetWAN   = "wan"   // memberlist.DefaultWANConfig: probe 5 s, suspicion ×6; regions across the world
	PresetLocal = "local" // memberlist.DefaultLocalConfig: loopback and tests
)

// Config configures one gossip node. The zero value is not usable: Node,
// Region and (unless Dev) SecretKey are required.
type Config struct {
	// Node is the stable node id (never an address); memberlist's node name.
	Node string
	// Region is the region this node serves, carried in the node metadata.
	Region string

	// BindAddr and BindPort are where memberlist listens (UDP and TCP on the
	// same port). BindPort 0 picks a free port (tests).
	BindAddr string
	BindPort int
	// AdvertiseAddr and AdvertisePort are what other nodes dial; empty and 0
	// mean the bind address and the actual port.
	AdvertiseAddr string
	AdvertisePort int

	// Join lists "host:port" seeds. Run retries until one answers, and
	// retries again whenever this node finds itself alone.
	Join []string

	// Interval is the report interval; it only sizes the rejoin period and
	// is shown to operators (default 10 s).
	Interval time.Duration

	// SecretKey (16, 24 or 32 bytes) turns on memberlist's AES-GCM
	// encryption and authentication of every packet and stream. Nodes with
	// different keys cannot join or exchange messages. Required unless Dev.
	SecretKey []byte
	// Dev allows running without a SecretKey (plaintext, unauthenticated),
	// on loopback only: BindAddr defaults to 127.0.0.1 and must be a
	// loopback address.
	Dev bool

	// Preset is "lan" (default), "wan" or "local".
	Preset string

	// QueueSize bounds the receive queue between memberlist's callbacks and
	// the decoder (default 1024 messages). A full queue drops and counts.
	QueueSize int
	// MaxMessageSize bounds one encoded message in bytes, sent or received
	// (default 16 MiB, under memberlist's 20 MiB stream limit).
	MaxMessageSize int
	// LeaveTimeout bounds the graceful leave when Run's ctx ends
	// (default 2 s).
	LeaveTimeout time.Duration
	// DeadNodeReclaim is how long after a node is declared dead a node with
	// the same name but another address may take its place (a restart on a
	// new port). Default: 30 s (lan), 60 s (wan), 1 s (local).
	DeadNodeReclaim time.Duration

	// ClockTolerance is how far ahead of this node's clock a received report
	// epoch or policy revision may lie (default 30 s, plus one Interval for
	// epochs); anything further is rejected, so that a message from the far
	// future cannot silence a region's real reports or freeze policy sync
	// until a restart. The other times a message carries are judged by its
	// receiver (the coordinator's Step), not here.
	ClockTolerance time.Duration
	// ContactEvery is how often this node pings the nodes of every other
	// region it watches (coordinator.PingTargets) with a contact ping of
	// its own, to measure when it was last in contact with each
	// (Member.Contact); a node of an older build is pinged through
	// memberlist's. Default Interval/40 (250 ms at a 10 s interval). The
	// coordinator cuts and reclaims shares from these times; see
	// region/globalshare.
	ContactEvery time.Duration
	// Now is the clock received messages are judged by; nil is time.Now.
	// Tests that drive the allocation on a virtual clock pass theirs.
	Now func() time.Time
	// Memberlist, if set, is called with memberlist's configuration just
	// before the node is created, to replace what the preset and the fields
	// above chose: another transport (mc.Transport, bound as mc.BindAddr
	// and mc.BindPort say, filling in mc.BindPort when it is 0), other
	// timings. An error fails New. gossiptest.FaultNet.Attach is one.
	Memberlist MemberlistHook

	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil: metrics are kept but not registered
}

// MemberlistHook adjusts memberlist's configuration before a node is
// created (Config.Memberlist).
type MemberlistHook func(mc *memberlist.Config) error

// Defaults.
const (
	DefaultInterval       = 10 * time.Second
	DefaultQueueSize      = 1024
	DefaultMaxMessageSize = 16 << 20
	DefaultLeaveTimeout   = 2 * time.Second
	DefaultClockTolerance = 30 * time.Second
	maxNameLen            = 128
)

// Validate reports the first setting that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Node == "":
		return errors.New("gossip: Node must be set (a stable node id)")
	case len(c.Node) > maxNameLen:
		return fmt.Errorf("gossip: Node is longer than %d bytes", maxNameLen)
	case c.Region == "":
		return errors.New("gossip: Region must be set")
	case len(c.Region) > maxNameLen:
		return fmt.Errorf("gossip: Region is longer than %d bytes", maxNameLen)
	case c.BindPort < 0 || c.BindPort > 65535:
		return fmt.Errorf("gossip: BindPort %d out of range", c.BindPort)
	case c.AdvertisePort < 0 || c.AdvertisePort > 65535:
		return fmt.Errorf("gossip: AdvertisePort %d out of range", c.AdvertisePort)
	case c.Interval < 0, c.ContactEvery < 0, c.QueueSize < 0, c.MaxMessageSize < 0, c.LeaveTimeout < 0, c.DeadNodeReclaim < 0, c.ClockTolerance < 0:
		return errors.New("gossip: durations and sizes must not be negative")
	case c.MaxMessageSize > 20<<20:
		return errors.New("gossip: MaxMessageSize above memberlist's 20 MiB stream limit")
	}
	switch len(c.SecretKey) {
	case 16, 24, 32:
	case 0:
		if !c.Dev {
			return errors.New("gossip: SecretKey is required (16, 24 or 32 bytes) unless Dev")
		}
	default:
		return fmt.Errorf("gossip: SecretKey must be 16, 24 or 32 bytes, got %d", len(c.SecretKey))
	}
	if c.Dev && c.BindAddr != "" && !IsLoopback(c.BindAddr) {
		return fmt.Errorf("gossip: Dev binds to loopback only, not %q", c.BindAddr)
	}
	switch c.Preset {
	case "", PresetLAN, PresetWAN, PresetLocal:
	default:
		return fmt.Errorf("gossip: unknown Preset %q (want lan, wan or local)", c.Preset)
	}
	for _, j := range c.Join {
		if _, p, err := net.SplitHostPort(j); err != nil || p == "" {
			return fmt.Errorf("gossip: Join address %q must be host:port", j)
		} else if _, err := strconv.Atoi(p); err != nil {
			return fmt.Errorf("gossip: Join address %q: bad port", j)
		}
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.ContactEvery == 0 {
		c.ContactEvery = c.Interval / 40
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = DefaultMaxMessageSize
	}
	if c.LeaveTimeout == 0 {
		c.LeaveTimeout = DefaultLeaveTimeout
	}
	if c.ClockTolerance == 0 {
		c.ClockTolerance = DefaultClockTolerance
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Preset == "" {
		c.Preset = PresetLAN
	}
	if c.DeadNodeReclaim == 0 {
		switch c.Preset {
		case PresetWAN:
			c.DeadNodeReclaim = 60 * time.Second
		case PresetLocal:
			c.DeadNodeReclaim = time.Second
		default:
			c.DeadNodeReclaim = 30 * time.Second
		}
	}
	if c.BindAddr == "" {
		c.BindAddr = "0.0.0.0"
		if c.Dev {
			c.BindAddr = "127.0.0.1"
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// memberlistConfig builds memberlist's config from c (after withDefaults).
func (c Config) memberlistConfig() *memberlist.Config {
	var mc *memberlist.Config
	switch c.Preset {
	case PresetWAN:
		mc = memberlist.DefaultWANConfig()
	case PresetLocal:
		mc = memberlist.DefaultLocalConfig()
	default:
		mc = memberlist.DefaultLANConfig()
	}
	mc.Name = c.Node
	mc.BindAddr = c.BindAddr
	mc.BindPort = c.BindPort
	mc.AdvertiseAddr = c.AdvertiseAddr
	mc.AdvertisePort = c.AdvertisePort
	if c.AdvertisePort == 0 {
		mc.AdvertisePort = c.BindPort
	}
	if len(c.SecretKey) > 0 {
		mc.SecretKey = append([]byte(nil), c.SecretKey...)
	}
	mc.DeadNodeReclaimTime = c.DeadNodeReclaim
	return mc
}

// lateAnswers is how long after it was sent a contact ping's answer still
// counts as contact (Member.Contact) when it comes after the ping was
// given up: Interval/4, longer than the coordinator's hold before it
// reclaims a region's share (Silence + two polls + the contact lag, 2.25 s
// at a 10 s interval), so that every answer that could keep a slow region
// in contact does.
func (c Config) lateAnswers() time.Duration { return c.Interval / 4 }

// RejoinInterval is how often a node that knows of dead peers, or is alone
// while seeds are configured, tries to reach them again, so a partition
// heals without an operator.
func (c Config) rejoinInterval() time.Duration {
	switch c.Preset {
	case PresetLocal:
		return time.Second
	case PresetWAN:
		return 30 * time.Second
	}
	return 10 * time.Second
}

// IsLoopback reports whether host (a name or an IP address, without a
// port) is a loopback address: localhost, 127.0.0.0/8 or ::1.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
