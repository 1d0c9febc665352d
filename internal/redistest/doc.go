// Package redistest runs real Redis servers, Redis Clusters and Sentinel
// groups (StartSentinel: a primary, a replica and three sentinels) for tests.
//
// Sluice's tests make claims about how Redis behaves: that a Lua script is
// atomic, that a key's slot moves to a replica after failover, that a paused
// server makes a call miss its deadline. A mock can only repeat what its author
// believed Redis does, so these tests start the real redis-server (7.0 or later)
// on free loopback ports instead, each in its own t.TempDir() with persistence
// off, and kill it when the test ends.
//
// Start, StartCluster and StartSentinel skip under go test -short. In the full run a missing
// redis-server or redis-cli is a test failure, not a skip, so CI cannot pass by
// silently testing nothing.
//
// Every method that takes or holds a testing.TB reports failure with t.Fatalf,
// so, like t.Fatalf itself, it must be called from the test's goroutine.
package redistest
