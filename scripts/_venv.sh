# Sourced by scripts/run, scripts/test, scripts/lint and scripts/doctor: create or reuse .venv with the
# project installed at the versions in constraints.txt. Needs only Python 3.11+ (with its venv module).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "attested-mesh needs Python 3.11+ as \`$py\` (set PYTHON=/path/to/python3.11)" >&2
    exit 1
fi
# The stamp names what was installed: a changed pyproject.toml or constraints.txt reinstalls.
stamp="$venv/.installed-$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -c1-16)"
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv" || {
        rm -rf "$venv"
        echo "could not create $venv; on Debian/Ubuntu: apt-get install -y python3-venv" >&2
        exit 1
    }
fi
if [ ! -f "$stamp" ]; then
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" -e "$root[test,lint]"
    rm -f "$venv"/.installed-*
    touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
cd "$root"
