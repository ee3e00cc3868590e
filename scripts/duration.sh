# Sourced by the benchmark scripts (bench-etcd.sh, profile-ycsb.sh).
#
# duration_secs NAME DURATION prints DURATION, whole hours, minutes or
# seconds as Go writes them (10s, 1m30s, 2h), in seconds, which bash can add
# up to bound a driver's run; for anything else (1.5s, 500ms, 0s) it prints
# why on stderr, naming the script NAME, and exits the script with status 2.
duration_secs() {
  local name=$1 duration=$2 secs=0 rest=$2
  while [[ $rest =~ ^([0-9]+)([hms])(.*)$ ]]; do
    case ${BASH_REMATCH[2]} in
      h) secs=$((secs + BASH_REMATCH[1] * 3600)) ;;
      m) secs=$((secs + BASH_REMATCH[1] * 60)) ;;
      s) secs=$((secs + BASH_REMATCH[1])) ;;
    esac
    rest=${BASH_REMATCH[3]}
  done
  if [ -n "$rest" ] || [ "$secs" -eq 0 ]; then
    echo "$name: duration $duration: give whole hours, minutes or seconds (10s, 1m30s)" >&2
    exit 2
  fi
  echo "$secs"
}
