#!/bin/bash
# One row of issue 51's table: a published training script, unchanged, tuned from its own
# folder (fetched for the check under /work/published/NAME, never committed here) in a
# --trials 5 run and a default run, each study in a fresh studies folder.
#   bash run_row.sh NAME trials5|default
# NAME/args holds the script's file (first line), autotune's flags before `--` (second) and the
# script's own arguments (third), and a folder of that script's to put on PYTHONPATH where one
# is needed (fourth, optional); the transcript goes to NAME/<mode>.txt beside it. autotune runs
# from the clone at /work/bench (the commit under test), not the working tree, on
# /work/venv-214's Python unless PYTHON names another (a venv of the script's own release).
set -u
here=$(cd "$(dirname "$0")" && pwd)
name=$1 mode=$2
script=$(sed -n 1p "$here/$name/args")
autotune_flags=$(sed -n 2p "$here/$name/args")
script_args=$(sed -n 3p "$here/$name/args")
extra_path=$(sed -n 4p "$here/$name/args")
extra=$([ "$mode" = trials5 ] && echo "--trials 5")
cd "/work/published/$name" || exit 1
rm -rf "studies_$mode"
start=$(date +%s)
# shellcheck disable=SC2086
PYTHONPATH=/work/bench${extra_path:+:$PWD/$extra_path} "${PYTHON:-/work/venv-214/bin/python}" -m autotune run --script "$script" --device cpu $extra \
    --studies-dir "studies_$mode" $autotune_flags -- $script_args > "$here/$name/$mode.txt" 2>&1
rc=$?
echo "rc $rc wall $(( $(date +%s) - start )) s at $(git -C /work/bench log --format=%h -1)" >> "$here/$name/$mode.txt"
ls -la /work/published/$name > "$here/$name/${mode}_folder_after.txt"
