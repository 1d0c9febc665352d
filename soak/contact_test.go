package soak

import (
	"testing"
	"time"
)

// losses returns samples every 10 s from t0, sample i with the counts
// counts[i] of daemon eu-0 for region ap.
func losses(counts ...float64) []Sample {
	out := make([]Sample, len(counts))
	for i, c := range counts {
		out[i] = Sample{At: at(10 * float64(i))}
		if c >= 0 {
			out[i].Losses = []Loss{{Daemon: "eu-0", Region: "eu", Lost: "ap", Count: c}}
		}
	}
	return out
}

// reclaimedAt sets the reclaimed count of samples[i] and of every later
// one to n.
func reclaimedAt(samples []Sample, i int, n float64) []Sample {
	for ; i < len(samples); i++ {
		samples[i].Losses[0].Reclaimed = n
	}
	return samples
}

func TestFalsePartitions(t *testing.T) {
	tests := []struct {
		name        string
		samples     []Sample
		faults      []Span
		explained   int
		unexplained int
		reclaimed   int // of the unexplained
	}{
		{"no loss", losses(0, 0, 0), nil, 0, 0, 0},
		{"lost region partitioned", losses(0, 1, 1), []Span{{Kind: Partition, Region: "ap", Start: at(4), End: at(9)}}, 1, 0, 0},
		{"finder partitioned", losses(0, 1, 1), []Span{{Kind: Partition, Region: "eu", Start: at(4), End: at(9)}}, 1, 0, 0},
		{"within slack after a partition", losses(0, 0, 1), []Span{{Kind: Partition, Region: "ap", Start: at(1), End: at(8)}}, 1, 0, 0},
		{"the third region partitioned", losses(0, 1, 1), []Span{{Kind: Partition, Region: "us", Start: at(4), End: at(9)}}, 0, 1, 0},
		{"starved", losses(0, 2, 2), []Span{{Kind: Starve, Region: "ap", Start: at(2), End: at(30)}}, 0, 2, 0},
		{"starved long enough to be reclaimed", reclaimedAt(losses(0, 2, 2), 1, 1), []Span{{Kind: Starve, Region: "ap", Start: at(2), End: at(30)}}, 0, 2, 1},
		{"reclaimed in a partition", reclaimedAt(losses(0, 1, 1), 1, 1), []Span{{Kind: Partition, Region: "ap", Start: at(4), End: at(9)}}, 1, 0, 0},
		{"long after a partition", losses(0, 0, 0, 1), []Span{{Kind: Partition, Region: "ap", Start: at(1), End: at(8)}}, 0, 1, 0},
		{"every daemon of the lost region down", losses(0, 1), []Span{
			{Kind: KillDaemon, Region: "ap", Daemon: "ap-0", Start: at(2), End: at(8)},
			{Kind: RollRegion, Region: "ap", Start: at(5), End: at(12)}}, 1, 0, 0},
		{"one daemon of the lost region down", losses(0, 1), []Span{
			{Kind: KillDaemon, Region: "ap", Daemon: "ap-0", Start: at(2), End: at(8)}}, 0, 1, 0},
		{"the same daemon killed twice", losses(0, 1), []Span{
			{Kind: KillDaemon, Region: "ap", Daemon: "ap-0", Start: at(2), End: at(8)},
			{Kind: KillDaemon, Region: "ap", Daemon: "ap-0", Start: at(5), End: at(9)}}, 0, 1, 0},
		{"a finder restarted counts from zero", losses(3, 3, 1, 1), nil, 0, 4, 0},
		{"a finder not answering for a while", losses(0, -1, 1), nil, 0, 1, 0},
		{"a partition while a finder did not answer", losses(0, -1, 1), []Span{{Kind: Partition, Region: "ap", Start: at(1), End: at(3)}}, 1, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vs, fig := FalsePartitions(tc.samples, tc.faults, 6*time.Second)
			if fig.Explained != tc.explained || fig.Unexplained != tc.unexplained || fig.UnexplainedReclaimed != tc.reclaimed {
				t.Errorf("FalsePartitions = %+v, want %d explained, %d unexplained, %d of them reclaimed", fig, tc.explained, tc.unexplained, tc.reclaimed)
			}
			n := 0
			for _, v := range vs {
				if v.Rule != RuleFalsePartition || v.Key != "eu-0>ap" {
					t.Errorf("violation %+v, want %s for eu-0>ap", v, RuleFalsePartition)
				}
				n += v.Admitted
			}
			if n != tc.unexplained {
				t.Errorf("violations count %d losses, want %d", n, tc.unexplained)
			}
		})
	}
}
