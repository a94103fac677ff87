#!/bin/bash
# Shared by the GPU machine's scripts (`source tools/h200_lib.sh`).

# nvrtc_ld_path: the LD_LIBRARY_PATH entries under which cudarc finds
# libnvrtc on this machine: /tmp/nv (a libnvrtc.so link where the library's
# folder has only libnvrtc.so.N, the name cudarc does not open) and that
# folder; nothing, and status 1, where there is no libnvrtc at all.
nvrtc_ld_path() {
  local f d
  f=$(find / -xdev -name 'libnvrtc.so*' 2> /dev/null | grep -v stub | head -1)
  [ -n "$f" ] || return 1
  d=$(dirname "$f")
  mkdir -p /tmp/nv
  # shellcheck disable=SC2012
  [ -e "$d/libnvrtc.so" ] || ln -sf "$(ls "$d"/libnvrtc.so.* | head -1)" /tmp/nv/libnvrtc.so
  echo "/tmp/nv:$d"
}

# unpack_bin FROM NAME TO: TO/NAME, executable, copied from FROM/NAME or
# unpacked from FROM/NAME.gz the first time (through a temporary name, so
# an interrupted copy is never taken for the binary); prints its path, or
# returns 1 where FROM has neither.
unpack_bin() {
  local from=$1 name=$2 to=$3
  [ -x "$to/$name" ] && { echo "$to/$name"; return 0; }
  mkdir -p "$to"
  if [ -f "$from/$name" ]; then
    cp "$from/$name" "$to/$name.tmp"
  elif [ -f "$from/$name.gz" ]; then
    gunzip -c "$from/$name.gz" > "$to/$name.tmp"
  else
    return 1
  fi
  chmod +x "$to/$name.tmp" && mv "$to/$name.tmp" "$to/$name" && echo "$to/$name"
}

# prompt_ids N [VOCAB]: N token ids below VOCAB (default 150000, under
# every generated model's vocabulary), comma-separated: the benchmarks'
# prompt.
prompt_ids() {
  python3 -c "print(','.join(str((i * 7919 + 13) % ${2:-150000}) for i in range($1)))"
}
