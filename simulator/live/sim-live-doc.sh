#!/usr/bin/env bash
# sim-live-doc.sh ROWS DOC: puts the table rows make sim-live's runs wrote
# to ROWS (one Markdown row per live run) into DOC's section between the
# sim-live markers, replacing what was there, or appends the section (below
# the notes marker, so make sim-report keeps it).
set -euo pipefail
rows=$1 doc=$2
begin='<!-- sim-live: written by make sim-live -->'
end='<!-- sim-live: end -->'
tmp=$(mktemp)
{
	echo "$begin"
	echo
	echo "## Live against virtual (make sim-live)"
	echo
	echo "The live-against-virtual comparisons of simulator/live (\`go test -tags simlive\`), one row per"
	echo "live run: real daemons, memberlist and HTTP checks on loopback, beside the virtual-time run of the"
	echo "same scenario (seed in the test). Measured $(date -u +%Y-%m-%d) on $(nproc) cores, load average"
	echo "$(cut -d' ' -f1-3 /proc/loadavg) at the end, $(go version | cut -d' ' -f3). \"Late p99\" is how long after"
	echo "their instants the run's checks were answered; a run later than half a burst of L is refused as"
	echo "measuring the machine (live.ErrBehind)."
	echo
	echo "| Run | global_error_p99_pct live | virtual | admitted_vs_oracle_pct live | virtual | live run took | late p99 | verdict |"
	echo "|---|---|---|---|---|---|---|---|"
	if [ -s "$rows" ]; then sort "$rows"; else echo "| (no run recorded) | | | | | | | |"; fi
	echo
	echo "$end"
} >"$tmp"
if grep -qF "$begin" "$doc"; then
	awk -v begin="$begin" -v end="$end" -v sect="$tmp" '
		$0 == begin { while ((getline l < sect) > 0) print l; skip = 1; next }
		$0 == end { skip = 0; next }
		!skip { print }' "$doc" >"$doc.new"
else
	{ cat "$doc"; echo; cat "$tmp"; } >"$doc.new"
fi
mv "$doc.new" "$doc"
rm -f "$tmp"
