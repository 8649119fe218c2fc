# Sourced by scripts/run, scripts/test, scripts/lint and scripts/doctor: create or reuse .venv with the
# project installed at the versions in constraints.txt. Needs only Python 3.11+ (with its venv module).
# A first run says what it does on stderr (creating the venv, then pip's progress: each package as it is
# collected, then the install); a run that finds the venv up to date says nothing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3}"
say() { echo "scripts: $*" >&2; }
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "attested-mesh needs Python 3.11+ as \`$py\` (set PYTHON=/path/to/python3.11)" >&2
    exit 1
fi
# The stamp names what was installed: a changed pyproject.toml or constraints.txt reinstalls.
stamp="$venv/.installed-$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -c1-16)"
if [ ! -x "$venv/bin/python" ]; then
    say "first run: creating $venv with $("$py" --version 2>&1) (a few seconds)"
    "$py" -m venv "$venv" || {
        rm -rf "$venv"
        echo "could not create $venv; on Debian/Ubuntu: apt-get install -y python3-venv" >&2
        exit 1
    }
fi
# pip's lines, one progress line each: "[n] collecting NAME" while it resolves, then the install (its full output
# is kept in the log and shown when it fails).
pip_progress() {
    local n=0 line
    while IFS= read -r line; do
        case "$line" in
            Collecting\ *|Obtaining\ *)
                n=$((n + 1))
                say "  [$n] ${line%% (*}" ;;
            Installing\ collected\ packages:*)
                say "  installing $n packages into .venv (the longest step, up to a minute)" ;;
            Successfully\ installed*)
                say "  done" ;;
        esac
    done
}
if [ ! -f "$stamp" ]; then
    log="$venv/pip-install.log"
    say "installing attested-mesh and its dependencies into .venv (pip, about 1-2 min on a first run; log: $log)"
    : > "$log"
    say "  upgrading pip in .venv"
    if ! { "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip \
           && "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
                  -c "$root/constraints.txt" -e "$root[test,lint]"; } > "$log" 2>&1 < /dev/null; then
        tail -30 "$log" >&2
        say "pip install failed; the whole output is in $log"
        exit 1
    fi &
    pip_pid=$!
    # Follow the log while pip writes it (bounded by pip's own end), one line per package.
    tail -n +1 --pid="$pip_pid" -f "$log" | pip_progress
    wait "$pip_pid" || exit 1  # not left to errexit: a caller may source this inside an && list
    rm -f "$venv"/.installed-*
    touch "$stamp"
    say "the venv is ready; later runs reuse it"
fi
export PATH="$venv/bin:$PATH"
cd "$root"
