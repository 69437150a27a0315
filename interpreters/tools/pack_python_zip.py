"""Builds the zip archives that interpreter copies import from.

Run at build time with Debian's /usr/bin/python3.11, whose bytecode format matches the
libpython3.11-pic.a that the copies are linked from. Each source is stored compiled (.pyc, what
imports load) and as it is (.py, deflated), so that tracebacks, `inspect.getsource` and
`linecache` show stdlib and `orochi` source lines through the zip importer's `get_source`;
nothing is read from the source tree at run time.

    pack_python_zip.py stdlib SRC_DIR OUT.zip      # Debian's stdlib, minus tests, GUIs, installers
    pack_python_zip.py package SRC_DIR OUT.zip [NATIVE_DIR]
        # a directory of Python packages (orochi/...); with NATIVE_DIR (Debian's lib-dynload),
        # adds _orochi_native_modules.py naming the C extension modules found there
"""

import importlib.util
import marshal
import sys
import zipfile
from pathlib import Path

# Top-level stdlib entries that a copy never needs: tests, GUI toolkits, installers, and
# files that only make sense for a system interpreter.
STDLIB_EXCLUDED_TOP = {
    "test", "idlelib", "tkinter", "turtledemo", "turtle.py", "ensurepip", "lib2to3",
    "lib-dynload", "site-packages", "dist-packages", "sitecustomize.py", "pydoc_data",
    "antigravity.py", "this.py", "__phello__", "__hello__.py", "EXTERNALLY-MANAGED",
    "LICENSE.txt",
}
# Test packages nested inside stdlib packages.
STDLIB_EXCLUDED_DIR_NAMES = {"test", "tests", "idle_test", "__pycache__"}


def compile_source(source: bytes, archive_name: str) -> bytes:
    """Returns the .pyc bytes (unchecked-hash header) for one source file."""
    code = compile(source, archive_name, "exec", dont_inherit=True, optimize=0)
    # An unchecked hash-based pyc: it never needs its source to be validated, and identical
    # sources give identical bytes, so the archive is reproducible.
    data = bytearray(importlib.util.MAGIC_NUMBER)
    data += (0b01).to_bytes(4, "little")  # flags: hash-based, do not check the source
    data += importlib.util.source_hash(source)
    data += marshal.dumps(code)
    return bytes(data)


def iter_sources(root: Path, stdlib: bool):
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if stdlib:
            if relative.parts[0] in STDLIB_EXCLUDED_TOP or relative.parts[0].startswith("config-"):
                continue
        if any(part in STDLIB_EXCLUDED_DIR_NAMES for part in relative.parts[:-1]):
            continue
        if path.is_file() and path.suffix == ".py":
            yield path, relative


def native_modules_source(native_dir: Path) -> bytes:
    names = sorted({path.name.split(".", 1)[0] for path in native_dir.glob("*.so")})
    lines = ['"""C extension modules the system Python ships as separate .so files (generated)."""',
             "", "NATIVE_MODULES = frozenset({"]
    lines += [f"    {name!r}," for name in names]
    lines += ["})", ""]
    return "\n".join(lines).encode()


def add_file(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    # A fixed date keeps the archive reproducible.
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)


def add_module(archive: zipfile.ZipFile, relative: Path, code_name: str, source: bytes) -> None:
    add_file(archive, relative.with_suffix(".pyc").as_posix(), compile_source(source, code_name))
    add_file(archive, relative.as_posix(), source)


def pack(kind: str, root: Path, out: Path, native_dir: Path | None) -> None:
    entries = 0
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
        if native_dir is not None:
            add_module(archive, Path("_orochi_native_modules.py"),
                       "<orochi>/_orochi_native_modules.py", native_modules_source(native_dir))
        for path, relative in iter_sources(root, stdlib=(kind == "stdlib")):
            # Tracebacks name the module as it lives in the archive, e.g. "<stdlib>/json/decoder.py".
            code_name = f"<{'stdlib' if kind == 'stdlib' else 'orochi'}>/{relative.as_posix()}"
            add_module(archive, relative, code_name, path.read_bytes())
            entries += 1
    if entries == 0:
        sys.exit(f"pack_python_zip: no Python sources under {root}")


def main() -> None:
    if len(sys.argv) not in (4, 5) or sys.argv[1] not in ("stdlib", "package"):
        sys.exit(__doc__)
    if sys.version_info[:2] != (3, 11):
        sys.exit(f"pack_python_zip: needs Python 3.11 (the copies' version), got {sys.version}")
    native_dir = Path(sys.argv[4]) if len(sys.argv) == 5 else None
    pack(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), native_dir)


if __name__ == "__main__":
    main()
