#!/usr/bin/env python3
"""Size and shape of the production Rust code, against the limits of CONTRIBUTING.md.

Production code is every `.rs` file under `functions/*/src` less what only tests compile: files
named `tests.rs` or under a `tests/` folder, modules declared under `#[cfg(test)]`, and items
marked `#[cfg(test)]` inside a file. It reports:

- lines of code per file (blank lines and comments aside), limit 500;
- lines of code per function (from its `fn` line to its closing brace, same counting), limit 80;
- `use super::*` outside tests;
- import cycles between files: file A names an item of file B (`use` or a `crate::`/`super::`/
  `self::` path) and B names one of A, directly or through other files. A module and the files
  of its own submodules are one family and do not count as a cycle (a parent re-exports its
  children, a child reads its parent's types).

`--check` exits 1 when a limit is broken (CI runs it so); without it the script only prints.
`--all` lists every file and function instead of the ten largest.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

FILE_LIMIT = 500
FN_LIMIT = 80
ROOT = Path(__file__).resolve().parents[2]


# --- a small Rust lexer: enough to tell code from comments and strings -------------------------

TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_comment>/\*)
  | (?P<raw_string>b?r(?P<hashes>\#*)")
  | (?P<string>b?"(?:\\.|[^"\\])*")
  | (?P<char>b?'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^'\\\n])')
  | (?P<lifetime>'[A-Za-z_][A-Za-z0-9_]*)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>[0-9][0-9a-zA-Z_.]*)
  | (?P<path_sep>::)
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass
class Tok:
    kind: str
    text: str
    line: int  # 1-based line of the token's start
    end_line: int


def lex(source: str) -> list[Tok]:
    tokens: list[Tok] = []
    pos, line = 0, 1
    while pos < len(source):
        m = TOKEN.match(source, pos)
        if m is None:
            raise ValueError(f"cannot lex at line {line}")
        kind = m.lastgroup
        if kind == "hashes":
            kind = "raw_string"
        end = m.end()
        if m.group("block_comment"):
            kind, depth, end = "block_comment", 1, m.end()
            while depth and end < len(source):
                if source.startswith("/*", end):
                    depth, end = depth + 1, end + 2
                elif source.startswith("*/", end):
                    depth, end = depth - 1, end + 2
                else:
                    end += 1
        elif m.group("raw_string"):
            closing = '"' + m.group("hashes")
            close = source.find(closing, m.end())
            end = len(source) if close < 0 else close + len(closing)
            kind = "string"
        text = source[pos:end]
        if kind != "ws":
            tokens.append(Tok(kind, text, line, line + text.count("\n")))
        line += text.count("\n")
        pos = end
    return tokens


def code_lines(tokens: list[Tok]) -> set[int]:
    """The lines that hold at least one token that is not a comment."""
    lines: set[int] = set()
    for t in tokens:
        if t.kind in ("line_comment", "block_comment"):
            continue
        lines.update(range(t.line, t.end_line + 1))
    return lines


def matching(tokens: list[Tok], open_index: int) -> int:
    """Index of the bracket closing the one at `open_index`."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    opener = tokens[open_index].text
    closer, depth = pairs[opener], 0
    for i in range(open_index, len(tokens)):
        text = tokens[i].text
        if tokens[i].kind != "punct":
            continue
        if text == opener:
            depth += 1
        elif text == closer:
            depth -= 1
            if depth == 0:
                return i
    return len(tokens) - 1


def strip_cfg_test(tokens: list[Tok]) -> tuple[list[Tok], list[str]]:
    """Drop items marked `#[cfg(test)]`; return the rest and the names of `mod x;` so marked."""
    kept: list[Tok] = []
    test_mods: list[str] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.text == "#" and i + 1 < len(tokens) and tokens[i + 1].text == "[":
            close = matching(tokens, i + 1)
            attr = "".join(x.text for x in tokens[i + 2 : close])
            if attr in ("cfg(test)", "cfg(any(test,feature=\"testing\"))") or attr.startswith(
                "cfg(test"
            ):
                # skip further attributes, then the item up to its `;` or its braced body
                j = close + 1
                while j < len(tokens) and tokens[j].text == "#":
                    j = matching(tokens, j + 1) + 1
                k = j
                while k < len(tokens) and tokens[k].text not in (";", "{"):
                    k += 1
                if k < len(tokens) and tokens[k].text == ";":
                    words = [x.text for x in tokens[j:k]]
                    if "mod" in words:
                        test_mods.append(words[words.index("mod") + 1])
                    i = k + 1
                else:
                    i = matching(tokens, k) + 1
                continue
        kept.append(t)
        i += 1
    return kept, test_mods


# --- modules and files ------------------------------------------------------------------------


@dataclass
class Module:
    crate: str
    path: tuple[str, ...]  # module path within the crate
    file: Path
    tokens: list[Tok] = field(default_factory=list)
    is_test: bool = False


def child_file(parent: Path, is_root_like: bool, name: str) -> Path | None:
    base = parent.parent if is_root_like else parent.with_suffix("")
    for candidate in (base / f"{name}.rs", base / name / "mod.rs"):
        if candidate.exists():
            return candidate
    return None


def load_crate(src: Path, crate: str) -> dict[tuple[str, ...], Module]:
    roots = [p for p in (src / "lib.rs", src / "main.rs") if p.exists()]
    modules: dict[tuple[str, ...], Module] = {}
    pending = [(root, (), False) for root in roots]
    while pending:
        file, path, is_test = pending.pop()
        if path in modules and modules[path].file == file:
            continue
        raw = lex(file.read_text())
        kept, test_mods = strip_cfg_test(raw)
        is_test = is_test or file.name == "tests.rs" or "tests" in file.relative_to(src).parts[:-1]
        module = Module(crate, path, file, kept if not is_test else [], is_test)
        modules[path] = module
        root_like = file.name in ("lib.rs", "main.rs", "mod.rs")
        for i, t in enumerate(raw):
            # `mod name;` at any depth of the file (inline modules hold no file children we need)
            if t.text == "mod" and i + 2 < len(raw) and raw[i + 2].text == ";":
                name = raw[i + 1].text
                child = child_file(file, root_like, name)
                if child is not None:
                    pending.append((child, path + (name,), is_test or name in test_mods))
    return modules


# --- measures ---------------------------------------------------------------------------------


def functions(tokens: list[Tok]) -> list[tuple[str, int, int]]:
    """(name, first line, lines of code) for every `fn` with a body."""
    lines = code_lines(tokens)
    found = []
    for i, t in enumerate(tokens):
        if t.kind == "ident" and t.text == "fn" and i + 1 < len(tokens):
            if tokens[i + 1].kind != "ident":
                continue  # `fn(` pointer types
            k = i + 2
            depth = 0
            while k < len(tokens):
                x = tokens[k].text
                if x in ("(", "[", "<") and tokens[k].kind == "punct":
                    depth += 1 if x != "<" else 0
                if x in (")", "]") and tokens[k].kind == "punct":
                    depth -= 1
                if depth == 0 and x in ("{", ";"):
                    break
                k += 1
            if k >= len(tokens) or tokens[k].text == ";":
                continue
            end = matching(tokens, k)
            span = {n for n in lines if t.line <= n <= tokens[end].line}
            found.append((tokens[i + 1].text, t.line, len(span)))
    return found


def paths_named(tokens: list[Tok]) -> list[list[str]]:
    """Module paths a file names: each `use` tree's leaves, and `crate::`/`super::`/`self::`
    paths in code."""
    out: list[list[str]] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.text == "use" and t.kind == "ident":
            end = i
            while end < len(tokens) and tokens[end].text != ";":
                end += 1
            out.extend(expand_use(tokens[i + 1 : end]))
            i = end + 1
            continue
        if (
            t.text in ("crate", "super", "self")
            and i + 1 < len(tokens)
            and tokens[i + 1].kind == "path_sep"
            and (i == 0 or tokens[i - 1].kind != "path_sep")
        ):
            segs = [t.text]
            k = i + 1
            while k + 1 < len(tokens) and tokens[k].kind == "path_sep" and tokens[k + 1].kind == "ident":
                segs.append(tokens[k + 1].text)
                k += 2
            out.append(segs)
            i = k
            continue
        i += 1
    return out


def expand_use(tokens: list[Tok]) -> list[list[str]]:
    def tree(i: int, prefix: list[str]) -> tuple[list[list[str]], int]:
        segs = list(prefix)
        results: list[list[str]] = []
        while i < len(tokens):
            t = tokens[i]
            if t.kind == "ident" or t.text == "*":
                segs.append(t.text)
                i += 1
            elif t.kind == "path_sep":
                i += 1
            elif t.text == "{":
                i += 1
                while i < len(tokens) and tokens[i].text != "}":
                    sub, i = tree(i, segs)
                    results.extend(sub)
                    if i < len(tokens) and tokens[i].text == ",":
                        i += 1
                return results, i + 1
            else:
                break
        if len(segs) > len(prefix):
            if "as" in segs:
                segs = segs[: segs.index("as")]
            results.append(segs)
        return results, i

    results, _ = tree(0, [])
    return results


def resolve(module: Module, segs: list[str], modules: dict) -> tuple[str, ...] | None:
    if not segs:
        return None
    head, rest = segs[0], segs[1:]
    if head == "crate":
        base: tuple[str, ...] = ()
    elif head == "self":
        base = module.path
    elif head == "super":
        base = module.path[:-1]
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    elif module.path + (head,) in modules:
        base, rest = module.path + (head,), rest
    else:
        return None  # another crate
    found = base
    for seg in rest:
        if found + (seg,) in modules:
            found = found + (seg,)
        else:
            break
    return found


def related(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    return a[: len(b)] == b or b[: len(a)] == a


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a limit is broken")
    parser.add_argument("--all", action="store_true", help="list every file and function")
    args = parser.parse_args()

    files: list[tuple[int, str]] = []
    fns: list[tuple[int, str]] = []
    glob_imports: list[str] = []
    graph: dict[str, set[str]] = {}
    for src in sorted(ROOT.glob("functions/*/src")):
        crate = src.parent.name
        modules = load_crate(src, crate)
        for module in modules.values():
            if module.is_test:
                continue
            rel = str(module.file.relative_to(ROOT))
            files.append((len(code_lines(module.tokens)), rel))
            for name, line, size in functions(module.tokens):
                fns.append((size, f"{rel}:{line} {name}"))
            for segs in paths_named(module.tokens):
                if segs[-1] == "*" and segs[0] == "super":
                    glob_imports.append(rel)
                target = resolve(module, segs, modules)
                if target is None or related(target, module.path):
                    continue
                other = modules[target]
                if other.is_test:
                    continue
                graph.setdefault(rel, set()).add(str(other.file.relative_to(ROOT)))

    files.sort(reverse=True)
    fns.sort(reverse=True)
    found_cycles = cycles(graph)
    big_files = [f for f in files if f[0] > FILE_LIMIT]
    long_fns = [f for f in fns if f[0] > FN_LIMIT]

    shown = None if args.all else 10
    print(f"production files: {len(files)}, {sum(n for n, _ in files)} lines of code")
    print(f"largest files (limit {FILE_LIMIT} lines of code):")
    for n, name in files[:shown]:
        print(f"  {n:5}  {name}{'  OVER' if n > FILE_LIMIT else ''}")
    print(f"longest functions (limit {FN_LIMIT} lines of code):")
    for n, name in fns[:shown]:
        print(f"  {n:5}  {name}{'  OVER' if n > FN_LIMIT else ''}")
    print(f"`use super::*` outside tests: {len(glob_imports)}")
    for name in sorted(set(glob_imports)):
        print(f"  {name}")
    print(f"import cycles between files: {len(found_cycles)}")
    for comp in found_cycles:
        print("  " + " ⇄ ".join(comp))
    broken = bool(big_files or long_fns or glob_imports or found_cycles)
    print(
        f"summary: {len(big_files)} files over {FILE_LIMIT}, {len(long_fns)} functions over "
        f"{FN_LIMIT}, {len(glob_imports)} glob imports of super, {len(found_cycles)} cycles"
    )
    return 1 if (args.check and broken) else 0


if __name__ == "__main__":
    sys.exit(main())
