package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/internal/redistest"
)

// scriptCalls sums, over the nodes of cl, the script calls (EVALSHA and
// EVAL). A merged call that holds an error reply for one of its checks
// counts among Redis's failed calls, so those are not told apart.
func scriptCalls(t testing.TB, cl *redistest.Cluster) (calls int64) {
	t.Helper()
	for _, node := range cl.Nodes() {
		info, err := node.Client(t).Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\r\n") {
			name, stats, ok := strings.Cut(line, ":")
			if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
				continue
			}
			for kv := range strings.SplitSeq(stats, ",") {
				k, v, _ := strings.Cut(kv, "=")
				x, _ := strconv.ParseInt(v, 10, 64)
				if k == "calls" {
					calls += x
				}
			}
		}
	}
	return calls
}

// TestRedisClusterMergedCallDecidesAsOneByOne sends batches as one script
// call to a Cluster node, as the store does on a Cluster: the checks whose
// slots the node serves are decided there, the others are sent again alone
// to their own nodes, and every decision is the memory store's for the
// same checks one by one. Fewer script calls reach Redis than checks.
func TestRedisClusterMergedCallDecidesAsOneByOne(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	subjects := make([]string, 12)
	for i := range subjects {
		subjects[i] = fmt.Sprint("user-", i)
	}
	subjects[1], subjects[2] = "{bob}", "=carol"
	sent := mergedDecidesAsOneByOne(t, cl.Client(t), subjects)
	calls := scriptCalls(t, cl)
	if calls >= int64(sent) {
		t.Errorf("%d checks took %d script calls, want fewer calls than checks", sent, calls)
	}
	t.Logf("%d checks in %d script calls", sent, calls)
}
