#!/usr/bin/env python3
"""Import circles between the modules of each crate: CI fails on any.

A module (one file) depends on another when it names it by path (`crate::a::b`, `super::b`,
`self::b`, or a child declared with `mod b;`). A parent that re-exports its children's items
and children that use their parent's items are the usual shape of a module tree, so edges
between a module and its own ancestors or descendants are not counted: a circle is a loop
through modules none of which contains another. Prints each circle and exits 1 when any.

Usage: scripts/cycles.py [crate_src_dir ...]   (default: every crate of the workspace)
"""
import os
import re
import sys

CRATES = ["kinds/src", "schedule/src", "model/src", "sim/src", "search/src", "plan/src", "kernels-core/src",
          "kernels-cuda/src", "kernels/src", "comm/src", "stage/src",
          "stage-runtime/src", "viz/src", "input/src", "calibrate/src", "derive/src", "cli/src", "src",
          "python/src"]


def module_files(src):
    """Maps each module path (a tuple) to its file."""
    mods = {}
    for dp, _, fs in os.walk(src):
        for f in fs:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dp, f), src)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            mods[tuple(rel)] = os.path.join(dp, f)
    return mods


# Comments, raw strings, strings and char literals, scanned left to right in one pass, so a
# quote inside a comment or a char literal (`'"'`) cannot open a string that hides code.
LEXEMES = re.compile(
    r"//[^\n]*|/\*.*?\*/"
    r'|\bb?r(#*)".*?"\1'
    r'|"(?:\\.|[^"\\])*"'
    r"|'(?:\\.|[^'\\])'",
    re.S,
)


def strip(text):
    text = LEXEMES.sub(lambda m: "" if m.group(0).startswith("/") else '""', text)
    # Unit tests may use anything of their parent's siblings; they are not the module graph.
    text = re.sub(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{.*", "", text, flags=re.S)
    return text


PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+|::\{)")


def expand_uses(text):
    """Yields each path a `use` tree or an expression names, with braces expanded."""
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        yield from expand(m.group(1).replace("\n", " "))
    for m in PATH.finditer(text):
        yield m.group(0).rstrip(":{")


def expand(tree):
    tree = tree.strip()
    i = tree.find("{")
    if i < 0:
        yield tree.split(" as ")[0].strip()
        return
    prefix, body = tree[:i], tree[i + 1:tree.rfind("}")]
    depth, cur, parts = 0, "", []
    for ch in body:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for p in parts:
        if p.strip():
            yield from expand(prefix + p.strip())


def resolve(path, here, mods, reexports=None):
    reexports = reexports or {}
    segs = path.split("::")
    if segs[0] == "crate":
        base, rest = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = here
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
        rest = segs
    else:
        return [None]
    best = base if base in mods else None
    found = [best]
    cur = base
    for i, s in enumerate(rest):
        cur = cur + (s,)
        if cur in mods:
            best = cur
            found = [best]
        else:
            # An item a module re-exports (`pub use child::Item`) is named through the
            # re-exporting module and lives in the defining one: the path depends on both.
            hops = 0
            while best in reexports and rest[i] in reexports[best] and hops < 8:
                best = reexports[best][rest[i]]
                found.append(best)
                hops += 1
            break
    return found


def related(a, b):
    return a[:len(b)] == b or b[:len(a)] == a


def circles(src):
    mods = module_files(src)
    texts = {m: strip(open(f, encoding="utf-8").read()) for m, f in mods.items()}
    reexports = {}
    for m, text in texts.items():
        for use in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", text):
            for path in expand(use.group(1).replace("\n", " ")):
                full = use.group(1)
                name = path.split("::")[-1]
                alias = re.search(r"\b%s\s+as\s+(\w+)" % re.escape(name), full)
                t = resolve(path if path.split("::")[0] in ("crate", "super", "self")
                            else "self::" + path, m, mods)[-1]
                if t is not None and t != m and name not in ("self", "*"):
                    reexports.setdefault(m, {})[alias.group(1) if alias else name] = t
    edges = {m: set() for m in mods}
    for m, text in texts.items():
        for path in expand_uses(text):
            for t in resolve(path, m, mods, reexports):
                if t is not None and t != m and not related(m, t):
                    edges[m].add(t)
    return [c for c in sccs(edges) if len(c) > 1], edges


def sccs(edges):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def name(m):
    return "::".join(m) or "crate"


def main():
    roots = sys.argv[1:] or [c for c in CRATES if os.path.isdir(c)]
    found = 0
    for src in roots:
        for comp in circles(src)[0]:
            found += 1
            members = sorted(comp)
            print(f"{src}: import circle: " + " <-> ".join(name(m) for m in members))
    if found:
        print(f"{found} import circle(s); move each shared type or helper to the module it "
              "belongs to, so that imports point one way", file=sys.stderr)
        sys.exit(1)
    print(f"no import circles in {len(roots)} crates")


if __name__ == "__main__":
    main()
