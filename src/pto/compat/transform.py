"""Source transformation for pypto's ``with pl.spmd(n) [as tid]:`` body form.

pypto parses kernel source, so ``with pl.spmd(n):`` runs its body once per
block (the body reads ``pl.tile.get_block_idx()``). pto runs kernels as
Python, where a ``with`` body runs once. Before a pypto module executes, its
syntax tree is rewritten::

    with pl.spmd(n, name_hint="x", deps=[...]) as tid:     _pto_spmd_12 = pl.spmd(n, name_hint="x", deps=[...])
        body                                        ->     for _pto_spmd_12_b in _pto_spmd_12:
                                                               body
                                                           tid = _pto_spmd_12.tid

Every new node carries the line and column of the ``with`` statement, and the
body keeps its own, so tracebacks and pto's error sites still name the user's
file and line. A ``break`` or ``continue`` directly in such a body (it would
bind to the new loop instead of the enclosing one) is a DslError naming the line.

A body (of the ``with`` form or of ``for b in pl.spmd(n)``) that calls
``pl.system.syncall()`` becomes a generator function whose barriers are
``yield pl.system.syncall()``, run by the decorator form ``pl.spmd(...)(body)``:
every block runs up to a barrier before any block goes past it. Each block keeps its own
variables across the barriers; a name the enclosing function also uses starts as its value
there and holds the last block's value after the task, as the plain loop form leaves it.
"""

from __future__ import annotations

import ast

from pto.errors import DslError

__all__ = ["transform_source", "compile_pypto", "needs_transform"]


def needs_transform(source: str) -> bool:
    """Cheap test: could ``source`` contain a ``with ...spmd(...)`` statement, or a ``for ... in
    pl.spmd(...)`` body with a ``syncall`` barrier?"""
    return "spmd" in source and ("with" in source or "syncall" in source)


def _is_spmd_call(node) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "spmd") or (isinstance(f, ast.Name) and f.id == "spmd")


class _LoopExits(ast.NodeVisitor):
    """Finds a break/continue that belongs to the with body itself (not to a loop inside it)."""

    def __init__(self):
        self.found = None

    def visit_For(self, node):  # loops inside own their break/continue; only their else can leak
        for n in node.orelse:
            self.visit(n)

    visit_While = visit_AsyncFor = visit_For

    def visit_FunctionDef(self, node):
        return

    visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = visit_FunctionDef

    def visit_Break(self, node):
        self.found = self.found or node

    visit_Continue = visit_Break


def _is_syncall(node) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "syncall")


def _walk_local(nodes):
    """Every node below ``nodes``, not descending into nested functions, lambdas or classes."""
    stack = list(nodes)
    while stack:
        n = stack.pop()
        yield n
        for child in ast.iter_child_nodes(n):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                stack.append(child)


class _Yields(ast.NodeTransformer):
    """``pl.system.syncall(...)`` statements become ``yield pl.system.syncall(...)``."""

    def visit_Expr(self, node):
        if _is_syncall(node):
            return ast.copy_location(ast.Expr(ast.copy_location(ast.Yield(node.value), node)), node)
        return node

    def visit_FunctionDef(self, node):
        return node

    visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = visit_FunctionDef


def _stored_names(target) -> list:
    """The plain names an assignment target binds (``a``, ``a, (b, c)``, ``*d``)."""
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


class _MarkAssigned:
    """After every statement of a phased body that binds one of ``names`` (an assignment, an
    augmented or annotated one; a ``for`` target at the start of its body; a ``with ... as``
    target at the start of its body), ``_pto_set.add(name)``; nested functions and classes are
    left alone (their names are their own)."""

    def __init__(self, names: set, stmts):
        self.names, self.stmts = names, stmts

    def _marks(self, bound) -> list:
        hit = [n for n in dict.fromkeys(bound) if n in self.names]
        return self.stmts("".join(f"_pto_set.add({n!r})\n" for n in hit)) if hit else []

    def mark(self, body: list) -> list:
        out = []
        for st in body:
            bound = []
            if isinstance(st, ast.Assign):
                bound = [n for t in st.targets for n in _stored_names(t)]
            elif isinstance(st, (ast.AugAssign, ast.AnnAssign)):
                bound = _stored_names(st.target)
            if isinstance(st, (ast.For, ast.AsyncFor)):
                st.body = self._marks(_stored_names(st.target)) + self.mark(st.body)
                st.orelse = self.mark(st.orelse)
            elif isinstance(st, (ast.With, ast.AsyncWith)):
                st.body = self._marks([n for it in st.items if it.optional_vars is not None
                                       for n in _stored_names(it.optional_vars)]) + self.mark(st.body)
            elif isinstance(st, (ast.If, ast.While)):
                st.body, st.orelse = self.mark(st.body), self.mark(st.orelse)
            elif isinstance(st, ast.Try):
                st.body, st.orelse, st.finalbody = self.mark(st.body), self.mark(st.orelse), self.mark(st.finalbody)
                for h in st.handlers:
                    h.body = self.mark(h.body)
            out.append(st)
            out += self._marks(bound)
        return out


class _SpmdWith(ast.NodeTransformer):
    def __init__(self, filename: str):
        self.filename = filename
        self.count = 0
        self.funcs: list = []  # enclosing function definitions, innermost last

    def visit_FunctionDef(self, node):
        self.funcs.append(node)
        try:
            self.generic_visit(node)
        finally:
            self.funcs.pop()
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_For(self, node: ast.For):
        self.generic_visit(node)
        if (_is_spmd_call(node.iter) and isinstance(node.target, ast.Name) and not node.orelse
                and any(_is_syncall(n) for n in _walk_local(node.body))):
            return self._phased(node, node.iter, node.target.id, None, "for")
        return node

    def _phased(self, node, call, var, as_target, form):
        """A body with ``pl.system.syncall()`` barriers: a generator function run in phases by the
        decorator form ``pl.spmd(...)(body)``. Every block's generator keeps its own locals (the
        blocks run interleaved, phase by phase). A name the body assigns that the enclosing code
        also uses is copied in (its value when the task starts, if it has one) and copied out
        after the task (the last block's value, as the loop form leaves it)."""
        self.count += 1
        handle = f"_pto_spmd_{node.lineno}_{self.count}"
        loc = dict(lineno=node.lineno, col_offset=node.col_offset, end_lineno=node.lineno,
                   end_col_offset=node.col_offset)
        body = [_Yields().visit(stmt) for stmt in node.body]
        assigned = {n.id for n in _walk_local(body) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        assigned.discard(var)
        if self.funcs:
            fn = self.funcs[-1]
            # every name of the function outside the task, nested lambdas and functions too (a
            # closure reading a name after the task reads the function's variable)
            inner = set(map(id, ast.walk(node)))
            outside = [n for stmt in fn.body for n in ast.walk(stmt) if id(n) not in inner]
            used = {n.id for n in outside if isinstance(n, ast.Name)}
            used |= {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
            shared = sorted(assigned & used)
        else:  # module level: any of them may be read later
            shared = sorted(assigned)
        cin, cout = handle + "_in", handle + "_out"

        def stmts(src):
            tree = ast.parse(src)
            for n in ast.walk(tree):
                if isinstance(n, (ast.stmt, ast.expr, ast.excepthandler)):
                    n.lineno, n.col_offset = loc["lineno"], loc["col_offset"]
                    n.end_lineno, n.end_col_offset = loc["end_lineno"], loc["end_col_offset"]
            return tree.body

        def save(into):
            return "".join(f"try:\n    {into}[{n!r}] = {n}\nexcept NameError:\n    pass\n" for n in shared)

        # a block hands a name back only if it assigned it (a block that left the value it started
        # with must not undo an earlier block's assignment: the loop form runs them in turn); every
        # assignment to a shared name records it in the block's _pto_set
        if shared:
            body = _MarkAssigned(set(shared), stmts).mark(body)
        changed = "".join(f"if {n!r} in _pto_set:\n    _pto_out[{n!r}] = {n}\n" for n in shared)
        if form == "for":  # the loop variable: the last block's index after the loop, as Python leaves it
            changed += f"_pto_out[{var!r}] = {var}\n"
        head = stmts("_pto_set = set()\n" + "".join(f"if {n!r} in _pto_in:\n    {n} = _pto_in[{n!r}]\n"
                                                    for n in shared))
        tail = stmts(changed)
        fdef = stmts(f"def {handle}_body({var}, _pto_in={cin}, _pto_out={cout}):\n    pass\n")[0]
        fdef.body = head + body + tail
        out = stmts(f"{cin} = {{}}\n{cout} = {{}}\n" + save(cin))
        out += [fdef,
                ast.Assign(targets=[ast.Name(handle, ast.Store(), **loc)], value=call, **loc),
                ast.Expr(ast.Call(ast.Name(handle, ast.Load(), **loc), [ast.Name(handle + "_body", ast.Load(), **loc)],
                                  [], **loc), **loc)]
        back = shared + ([var] if form == "for" else [])
        out += stmts("".join(f"if {n!r} in {cout}:\n    {n} = {cout}[{n!r}]\n" for n in back))
        if as_target is not None:
            out.append(ast.Assign(targets=[as_target],
                                  value=ast.Attribute(ast.Name(handle, ast.Load(), **loc), "tid", ast.Load(), **loc),
                                  **loc))
        return out

    def visit_With(self, node: ast.With):
        self.generic_visit(node)
        if len(node.items) != 1 or not _is_spmd_call(node.items[0].context_expr):
            return node
        item = node.items[0]
        if any(_is_syncall(n) for n in _walk_local(node.body)):
            return self._phased(node, item.context_expr, f"_pto_spmd_{node.lineno}_blk", item.optional_vars, "with")
        finder = _LoopExits()
        for stmt in node.body:
            finder.visit(stmt)
        if finder.found is not None:
            kw = "break" if isinstance(finder.found, ast.Break) else "continue"
            raise DslError(f"{self.filename}:{finder.found.lineno}: `{kw}` directly inside a `with pl.spmd(...)` "
                           f"body (line {node.lineno}) is not supported by pto pypto; move it out of the task")
        self.count += 1
        handle = f"_pto_spmd_{node.lineno}_{self.count}"
        loc = dict(lineno=node.lineno, col_offset=node.col_offset,
                   end_lineno=node.lineno, end_col_offset=node.col_offset)
        out = [ast.Assign(targets=[ast.Name(handle, ast.Store(), **loc)], value=item.context_expr, **loc),
               ast.For(target=ast.Name(handle + "_b", ast.Store(), **loc), iter=ast.Name(handle, ast.Load(), **loc),
                       body=node.body, orelse=[], **loc)]
        if item.optional_vars is not None:
            target = item.optional_vars
            out.append(ast.Assign(targets=[target],
                                  value=ast.Attribute(ast.Name(handle, ast.Load(), **loc), "tid", ast.Load(), **loc),
                                  **loc))
        return out


def transform_source(source: str, filename: str) -> tuple[ast.Module, int]:
    """Parse ``source`` and rewrite its ``with <...>.spmd(...)`` statements.

    Returns:
        (module tree, number of statements rewritten).

    Raises:
        SyntaxError: the source does not parse.
        DslError: a break/continue directly inside such a body.
    """
    tree = ast.parse(source, filename=filename)
    tr = _SpmdWith(filename)
    tree = tr.visit(tree)
    ast.fix_missing_locations(tree)
    return tree, tr.count


def compile_pypto(source: str, filename: str):
    """The code object of a pypto module with the ``with pl.spmd`` body form rewritten."""
    if not needs_transform(source):
        return compile(source, filename, "exec", dont_inherit=True)
    tree, _ = transform_source(source, filename)
    return compile(tree, filename, "exec", dont_inherit=True)
