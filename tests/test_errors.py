"""Malformed inputs: each gives one located FmhaError with the expected rule, line and column."""

import pytest

import fmha_dsl
from fmha_dsl import FmhaError, ParseError

OK_SIG = "signature { family(fwd) dtype(fp16) hdim(128) }"

# (text, rule, line, column)
CASES = [
    # --- syntax
    ("kernel_set a {", "syntax.unexpected-eof", 1, 15),
    ("kernel_set { }", "syntax.unexpected-token", 1, 12),
    ("kernel_set a { kernel { signature { family(fwd } } }", "syntax.unexpected-token", 1, 48),
    ("kernel_set a { kernel { signature { family fwd } } }", "syntax.unexpected-token", 1, 44),
    ("kernel_set a { kernel { signature { dtype(fp16,) hdim(,) } } }", "syntax.unexpected-token", 1, 55),
    ("kernel_set a { kernel { signature { dtype(fp16 $) } } }", "syntax.unexpected-character", 1, 48),
    ('kernel_set a { kernel { signature { family("fwd) } } }', "syntax.unterminated-string", 1, 44),
    ("kernel_set a { kernel { where hdim_q == } }", "syntax.unexpected-token", 1, 41),
    ("kernel_set a {\n  /* never closed\n  arch(gfx942) }", "syntax.unterminated-comment", 2, 3),
    ("kernel_set a { kernel { where tile_m0 /* x\n } }", "syntax.unterminated-comment", 1, 39),
    ("kernel_set a { kernel { signature { family(fwd) } algorithm { block_per_cu(99999999999) } } }", "value.range", 1, 76),
    ("kernel_set a { arch(gfx942)\x00 }", "syntax.unexpected-character", 1, 28),
    ("kernel_set a { arch(gfx942) \ufeff}", "syntax.unexpected-character", 1, 29),
    ("kernel_set a { kernel { where (hdim_q == 1 } }", "syntax.unexpected-token", 1, 44),
    ("kernel_set a {\n  kernel {\n    signature { family(fwd) }\n", "syntax.unexpected-eof", 3, 30),
    ("kernel_set a { kernel { signature { hdim([64, 128) } } }", "syntax.unexpected-token", 1, 50),
    ("include\nkernel_set a { }", "syntax.unexpected-token", 2, 1),
    ("kernel_set a { kernel { signature { } } } }", "syntax.unexpected-token", 1, 43),
    ("kernel a { }", "syntax.unexpected-token", 1, 1),
    ("kernel_set a { kernel { where hdim_q === 1 } }", "syntax.unexpected-token", 1, 40),
    ("kernel_set a { add(FmhaSignature().dtype(fp16)) }", "syntax.unexpected-token", 1, 47),
    ("kernel_set a { kernel { signature { dtype(fp16 | ) } } }", "syntax.unexpected-token", 1, 50),
    ("kernel_set 1a { }", "syntax.unexpected-token", 1, 12),
    ("kernel_set a { kernel { signature { hdim(1e3) } } }", "syntax.number", 1, 42),
    ("kernel_set a { kernel { signature { hdim(0x80, 1.5) } } }", "syntax.number", 1, 42),
    ("kernel_set a { kernel { signature { hdim(128abc) } } }", "syntax.unexpected-token", 1, 45),
    ('kernel_set a {\n  .add(FmhaSignature().family("fwd").hdim(128)\n       FmhaAlgorithm().pipeline("qr"), "gfx942")\n}',
     "syntax.unexpected-token", 3, 8),   # (the comma missing before FmhaAlgorithm: the caret under it)
    # --- setters
    ("kernel_set a { kernel { signature { dtpye(fp16) } } }", "setter.unknown", 1, 37),
    ("kernel_set a { kernel { signature { tile(*) } } }", "setter.wrong-block", 1, 37),
    ("kernel_set a { kernel { algorithm { dtype(fp16) } } }", "setter.wrong-block", 1, 37),
    ("kernel_set a { kernel { signature { arch(gfx942) } } }", "setter.wrong-block", 1, 37),
    ("kernel_set a { kernel { signature { dtype(fp16) dtype(bf16) } } }", "setter.duplicate", 1, 49),
    ("kernel_set a { kernel { signature { hdim(1, 2, 3) } } }", "setter.arity", 1, 48),
    ("kernel_set a { kernel { signature { hdim(q=64, w=64) } } }", "setter.keyword", 1, 48),
    ("kernel_set a { kernel { algorithm { tile(1, 2, 3) } } }", "setter.arity", 1, 37),
    ("kernel_set a { kernel { algorithm { wave(1, 2) } } }", "setter.arity", 1, 37),
    ("kernel_set a { kernel { signature { family() } } }", "setter.arity", 1, 37),
    ("kernel_set a { profile(ck_default) receipt(0) kernel { } }", "setter.duplicate", 1, 36),
    # --- values
    ("kernel_set a { kernel { signature { dtype(fp17) } } }", "value.unknown", 1, 43),
    ("kernel_set a { kernel { signature { mask(casual) } } }", "value.unknown", 1, 42),
    ("kernel_set a { kernel { signature { bias(7) } } }", "value.type", 1, 42),
    ("kernel_set a { kernel { signature { lse(maybe) } } }", "value.type", 1, 41),
    ("kernel_set a { kernel { signature { hdim(fp16) } } }", "value.type", 1, 42),
    ("kernel_set a { kernel { signature { hdim(0) } } }", "value.range", 1, 42),
    ("kernel_set a { kernel { signature { dtype(* | fp16) } } }", "value.wild-mixed", 1, 43),
    ("kernel_set a { kernel { algorithm { padding(true, 3, true, true) } } }", "value.range", 1, 51),
    ("kernel_set a { arch(gfx941) kernel { } }", "value.unknown", 1, 21),
    ("kernel_set a { profile(ck_defualt) kernel { } }", "value.unknown", 1, 24),
    ("kernel_set a { receipt(5) kernel { } }", "value.unknown", 1, 24),
    ("kernel_set a { kernel { algorithm { pipeline(qr_asink) } } }", "value.unknown", 1, 46),
    ("kernel_set a { kernel { algorithm { tile_m0(x) } } }", "value.type", 1, 45),
    ("kernel_set a { kernel { signature { kv_cache(paged) } } }", "value.unknown", 1, 46),
    ("kernel_set a { mask_impl(fancy) kernel { } }", "value.unknown", 1, 26),
    # --- where clauses
    ("kernel_set a { kernel { where hdim_z == 1 } }", "where.unknown-name", 1, 31),
    ('kernel_set a { kernel { where hdim_q == "x" } }', "where.type", 1, 31),
    ("kernel_set a { kernel { where hdim_q } }", "where.type", 1, 25),
    ("kernel_set a { kernel { where hdim_q in 3 } }", "where.type", 1, 41),
    ("kernel_set a { kernel { where lse and 1 } }", "where.type", 1, 39),
    ("kernel_set a { kernel { where lse == 1 } }", "where.type", 1, 31),   # a flag is true/false, not 0/1
    ("kernel_set a { kernel { where 128 != dropout } }", "where.type", 1, 31),
    ("kernel_set a { kernel { where hdim_q == true } }", "where.type", 1, 31),
    # --- sets
    ("kernel_set a { arch(gfx942) }", "set.empty", 1, 12),
    ("// nothing here\n", "set.none", 1, 1),   # a file-level error is located at the file's start
]


@pytest.mark.parametrize("text,rule,line,col", CASES, ids=[f"{i:02d}-{c[1]}" for i, c in enumerate(CASES)])
def test_malformed_input_is_located(text, rule, line, col, write):
    path = write("bad.fmha", text)
    with pytest.raises(FmhaError) as info:
        ks = fmha_dsl.load(path)
        ks.expand()
    err = info.value
    assert err.rule == rule, err.render()
    if line is not None:
        assert (err.line, err.column) == (line, col), err.render()
        assert err.path == path
        rendered = err.render()
        assert f"{path}:{line}:{col}: error[{rule}]" in rendered
        assert "^" in rendered  # a caret under the offending text
    assert all(d.hint for d in err.diagnostics) or rule.startswith("where"), err.render()


def test_case_count():
    assert len(CASES) >= 40


@pytest.mark.parametrize("written,hint", [("1e3", "write `1000`"), ("0x80", "write `128`"), ("2.0e2", "write `200`"),
                                          ("1.5", "values are integers")])
def test_numbers_of_other_languages_get_their_decimal_spelling(written, hint):
    with pytest.raises(ParseError) as info:
        fmha_dsl.loads(f"kernel_set a {{ kernel {{ signature {{ hdim({written}) }} }} }}")
    assert info.value.rule == "syntax.number" and hint in info.value.hint and f"`{written}`" in str(info.value)


@pytest.mark.parametrize("op,hint", [("=>", "write `>=`"), ("=<", "write `<=`"), ("=!", "write `!=`"),
                                     ("=", "to compare, write `==`")])
def test_a_comparison_written_the_other_way_round_gets_its_operator(op, hint):
    with pytest.raises(ParseError) as info:
        fmha_dsl.loads(f"kernel_set s {{ kernel {{ signature {{ family(fwd) }} where tile_m0 {op} 64 }} }}")
    assert info.value.hint.startswith(hint)


@pytest.mark.parametrize("where,name,op", [
    ("tile_m0 >= 64 tile_n0 == 128", "tile_n0", "=="),
    ('pipeline != "qs"\n    hdim_q in [64, 128]', "hdim_q", "in"),
    ("(tile_m0 >= 64 or tile_k0 == 32) tile_n0 = 128", "tile_n0", "=="),
])
def test_a_where_condition_with_no_and_before_it_says_to_join_them(where, name, op):
    text = f"kernel_set s {{ kernel {{ signature {{ family(fwd) }}\n where {where} }} }}"
    with pytest.raises(ParseError) as info:
        fmha_dsl.loads(text)
    err = info.value
    assert err.rule == "syntax.unexpected-token" and f"`{name}` starts a new condition" in str(err)
    assert err.hint == f"join a `where` clause's conditions with `and` or `or`: `... and {name} {op} ...`"
    line = text.splitlines()[err.span.line - 1]
    assert line[err.span.column - 1:err.span.end_column - 1] == name   # the caret under the name
    fmha_dsl.loads(text.replace(f" {name}", f" and {name}").replace(" = 128", " == 128"))   # the fix parses


def test_a_setter_after_a_where_clause_is_not_taken_for_a_condition():
    with pytest.raises(ParseError) as info:   # `pipeline qr` (no parentheses) after a complete clause
        fmha_dsl.loads("kernel_set s { kernel { signature { family(fwd) } where tile_m0 >= 64 pipeline qr } }")
    assert "starts a new condition" not in str(info.value) and "setters are calls" in info.value.hint


@pytest.mark.parametrize("where,hint", [
    ("hdim == 128", "`hdim(...)` sets `hdim_q`, `hdim_v`: name one of them"),
    ("padding == true", "`padding(...)` sets `pad_s`, `pad_sk`, `pad_d`, `pad_dv`: name one of them"),
    ("kv_cache == 1", "`kv_cache(...)` sets `kv_layout`, `kv_lookup`, `page_size`: name one of them"),
    ("pad == true", "did you mean `pad_s`?"),   # (no setter of that name: a spelling)
])
def test_a_setter_name_in_a_where_clause_names_the_fields_it_sets(where, hint):
    with pytest.raises(ParseError) as info:
        fmha_dsl.loads(f"kernel_set s {{ kernel {{ signature {{ family(fwd) }} where {where} }} }}")
    assert info.value.rule == "where.unknown-name" and info.value.hint == hint


@pytest.mark.parametrize("text,comma", [
    ('.add(FmhaSignature().family("fwd").hdim(128)\n FmhaAlgorithm().pipeline("qr"))', True),   # (no arch)
    ('.add(FmhaSignature().family("fwd").hdim(128)\n FmhaAlgorithm().pipeline("qr"), "gfx942")', True),
    ('.add(FmhaSignature().family("fwd").hdim(128), // then FmhaAlgorithm()\n FmhaAlgo().pipeline("qr"), "gfx942")',
     False),   # (the word in a comment: a misspelt constructor is what is wrong)
    ('.add(FmhaSignature().family("fwd").name("FmhaAlgorithm"), "gfx942")', False),   # (in a string)
])
def test_a_missing_comma_before_fmha_algorithm_is_named_only_where_it_is_missing(text, comma):
    with pytest.raises(ParseError) as info:
        fmha_dsl.loads("kernel_set a {\n" + text + "\n}")
    d = info.value.diagnostics[0]
    assert ("no `,` before it" in d.message) == comma, d.render()
    if comma:
        assert (d.span.line, d.span.column) == (3, 2)


def test_hints_suggest_spelling(write):
    with pytest.raises(FmhaError) as info:
        fmha_dsl.load(write("a.fmha", "kernel_set a { kernel { signature { dtype(bf61) } } }"))
    assert "bf16" in info.value.hint


def test_unknown_setter_suggestion(write):
    with pytest.raises(FmhaError) as info:
        fmha_dsl.load(write("a.fmha", "kernel_set a { kernel { algorithm { pipline(qr) } } }"))
    assert "pipeline" in info.value.hint


def test_several_errors_are_all_reported(write):
    text = "kernel_set a { kernel { signature { dtype(fp17) mask(casual) } } }"
    with pytest.raises(FmhaError) as info:
        fmha_dsl.load(write("a.fmha", text))
    assert [d.rule for d in info.value.diagnostics] == ["value.unknown", "value.unknown"]


def test_where_errors_come_with_the_setter_errors_whatever_arch_is_asked_for(write):
    """Every input error of a file in one run: where clauses are compiled when the file is read, not when a
    declaration is expanded (one for gfx950 only was not checked by `--arch gfx942`)."""
    text = ("kernel_set s {\n  arch(gfx942, gfx950)\n  kernel a { signature { family(fwd) hdim(128) } }\n"
            "  kernel b {\n    arch(gfx950)\n    signature { family(fwd) dtyp(bf16) }\n"
            "    where pipelin == \"qr_async\"\n    where hdim_q in [128, \"x\"]\n  }\n  where lse == 3\n}\n")
    with pytest.raises(FmhaError) as info:
        fmha_dsl.load(write("a.fmha", text)).expand(arch="gfx942")
    got = [(d.rule, d.span.line) for d in info.value.diagnostics]
    assert got == [("where.type", 10), ("setter.unknown", 6), ("where.unknown-name", 7), ("where.type", 8)]


def test_include_cycle(write):
    a = write("a.fmha", 'include "b.fmha"\nkernel_set a { kernel { } }')
    write("b.fmha", 'include "a.fmha"\n')
    with pytest.raises(FmhaError) as info:
        fmha_dsl.load(a)
    assert info.value.rule == "include.cycle"
    assert info.value.line == 1
    assert "a.fmha -> b.fmha -> a.fmha" in info.value.message


def test_missing_include(write):
    a = write("a.fmha", 'include "nope.fmha"\nkernel_set a { kernel { } }')
    with pytest.raises(FmhaError) as info:
        fmha_dsl.load(a)
    assert info.value.rule == "input.file-not-found"
    assert (info.value.line, info.value.column) == (1, 1)


def test_missing_file():
    with pytest.raises(FmhaError) as info:
        fmha_dsl.load("/no/such/file.fmha")
    assert info.value.rule == "input.file-not-found"


def test_not_utf8(tmp_path):
    p = tmp_path / "x.fmha"
    p.write_bytes(b"kernel_set a { \xff }")
    with pytest.raises(FmhaError) as info:
        fmha_dsl.load(str(p))
    assert info.value.rule == "input.not-utf8"
    p.write_bytes("kernel_set a {\n    arch(gfx942)  # café\n".encode("latin-1"))   # é: one byte 0xe9
    with pytest.raises(FmhaError) as info:
        fmha_dsl.load(str(p))
    d = info.value.diagnostics[0]
    assert (d.span.line, d.span.column) == (2, 24) and "a byte 0xe9 here" in d.message and "^" in info.value.render()


def test_the_numpy_backward_takes_the_forwards_dtypes():
    import numpy as np

    q = np.random.default_rng(0).random((1, 2, 3, 8)).astype(np.float32)
    out, lse = fmha_dsl.attention(q, q, q, return_lse=True)
    for args, says in (((out.astype(np.float16), lse, out), "`out` must have q's dtype float32, got float16"),
                       ((out, lse, out.astype(np.float64)), "`dout` must have q's dtype float32, got float64"),
                       ((out, lse.astype(np.float16), out), "`lse` must be the forward's float32 LSE")):
        with pytest.raises(fmha_dsl.errors.UsageError, match=says):
            fmha_dsl.attention_backward(q, q, q, *args)


def test_numpy_calls_take_a_bias_or_alibi_slopes_as_the_kernels_do():
    """What runs on arrays runs on the GPU: the reference would add both, the kernels take one."""
    import numpy as np

    q = np.zeros((1, 2, 3, 8), np.float32)
    both = dict(bias=np.zeros((1, 2, 3, 3), np.float32), alibi_slopes=np.ones(2, np.float32))
    with pytest.raises(fmha_dsl.errors.UsageError, match=r"attention\(\): bias and alibi_slopes cannot be combined"):
        fmha_dsl.attention(q, q, q, **both)
    with pytest.raises(fmha_dsl.errors.UsageError, match=r"attention_backward\(\): bias and alibi_slopes cannot"):
        fmha_dsl.attention_backward(q, q, q, q, np.zeros((1, 2, 3), np.float32), q, **both)


def test_a_byte_order_mark_is_not_text(tmp_path):
    """Some editors start UTF-8 files with a BOM (EF BB BF): it used to be `unexpected character`."""
    p = tmp_path / "bom.fmha"
    p.write_bytes(b"\xef\xbb\xbfkernel_set a {\n arch(gfx942)\n kernel k { signature { family(fwd) dtype(fp16) "
                  b"hdim(128) } }\n}\n")
    assert len(fmha_dsl.load(str(p)).expand()) == 2
    assert len(fmha_dsl.loads(p.read_text(encoding="utf-8")).expand()) == 2   # (read as text: U+FEFF first)


def test_error_pickles():
    import pickle

    with pytest.raises(FmhaError) as info:
        fmha_dsl.loads("kernel_set a {")
    e2 = pickle.loads(pickle.dumps(info.value))
    assert e2.rule == info.value.rule and e2.line == info.value.line


def test_hdim_v_without_q_is_located(write):
    with pytest.raises(FmhaError) as info:
        fmha_dsl.load(write("a.fmha", "kernel_set a { kernel { signature { hdim(v=64) } } }"))
    assert info.value.rule == "setter.arity" and info.value.hint


def test_hdim_v_out_of_range_points_at_v(write):
    with pytest.raises(FmhaError) as info:
        fmha_dsl.load(write("a.fmha", "kernel_set a { kernel { signature { hdim(64, 2000) } } }"))
    assert info.value.rule == "value.range" and info.value.column == 46


def test_error_classes_say_whose_fault_it_is():
    from fmha_dsl import errors as E

    assert issubclass(fmha_dsl.ParseError, E.InputError) and issubclass(fmha_dsl.UsageError, E.InputError)
    assert issubclass(fmha_dsl.RegistryError, E.InputError) and issubclass(fmha_dsl.RuleError, E.InputError)
    table = {E.ParseError: ("input", 2), E.UsageError: ("input", 2), E.RegistryError: ("input", 2),
             E.RuleError: ("input", 1), E.BuildError: ("build", 1), E.DispatchError: ("dispatch", 1),
             E.InternalError: ("internal", 70)}
    for cls, (fault, code) in table.items():
        assert (cls.fault, cls.exit_code) == (fault, code) and issubclass(cls, FmhaError)
    # error() without cls= picks the class from the rule's namespace
    assert type(E.error("dispatch.no-binary", "x")) is E.DispatchError
    assert type(E.error("runtime.cuda", "x")) is E.DispatchError
    assert type(E.error("runtime.jit", "x")) is E.BuildError
    assert type(E.error("usage.value", "x")) is E.UsageError
    assert type(E.error("internal.parse", "x")) is E.InternalError
    assert type(E.error("dispatch.no-device", "x", cls=E.UsageError)) is E.UsageError
    assert type(E.error("nothing.known", "x")) is FmhaError


def test_cli_exit_code_follows_the_class(monkeypatch, capsys):
    from fmha_dsl import cli
    from fmha_dsl import errors as E

    for cls, code in ((E.UsageError, 2), (E.RuleError, 1), (E.BuildError, 1), (E.DispatchError, 1),
                      (E.InternalError, 70)):
        def boom(args, cls=cls):
            raise E.error("x.y", "boom", cls=cls)

        monkeypatch.setattr(cli, "cmd_check", boom)
        assert cli.main(["check", "ck_receipt0"]) == code
    assert "this is a bug" in capsys.readouterr().err


def test_wrong_argument_types_to_the_python_api_are_usage_errors():
    """Not a bare TypeError from os.fspath or list(): the argument, what was expected and a hint."""
    import glob
    import os

    import numpy as np

    with pytest.raises(fmha_dsl.errors.UsageError, match="load\\(\\) takes the path of a .fmha file.*got NoneType"):
        fmha_dsl.load(None)
    with pytest.raises(fmha_dsl.errors.UsageError, match="got int"):
        fmha_dsl.load(3)
    kernels = fmha_dsl.load(sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "kernelsets", "*.fmha")))[0])
    with pytest.raises(fmha_dsl.errors.UsageError, match="arch must be a name like 'gfx942'.*got int 5"):
        kernels.expand(arch=5)
    q = np.zeros((1, 2, 3, 8), np.float32)
    with pytest.raises(fmha_dsl.errors.UsageError, match=r"offset must be an int in \[0, 2\*\*63\)"):
        fmha_dsl.attention(q, q, q, dropout_p=0.1, seed=1, offset=2 ** 63)
    with pytest.raises(fmha_dsl.errors.UsageError, match=r"`lse` must be the forward's float32 LSE \(or float64\), "
        r"got dtype <U1"):
        fmha_dsl.attention_backward(q, q, q, q, np.full((1, 2, 3), "x"), q)


def test_the_caret_stays_under_its_text_after_wide_characters():
    """A CJK character takes two terminal cells: the caret line counts cells, not characters."""
    with pytest.raises(FmhaError) as info:
        fmha_dsl.loads('kernel_set s { constraint("注意") kernel { signature { family(fwd) dtype(fp17) } } }')
    lines = info.value.diagnostics[0].render().splitlines()
    src, caret = lines[2].split(" | ", 1)[1], lines[3].split(" | ", 1)[1]
    assert caret.index("^") == src.index("fp17") + 2 and caret.strip() == "^^^^"
