""".fmha input at the edges: what fuzzing the parser, the setters, `where` and `fmt` found (crashes, silent
acceptance, comments moved by the formatter).  Each case asserts the located error or the exact result."""

import os
import subprocess
import sys
import threading

import pytest

import fmha_dsl
from fmha_dsl import FmhaError, format_source

SIG = "signature { family(fwd) dtype(fp16) hdim(128) }"


def _err(text, rule, *fragments):
    with pytest.raises(FmhaError) as e:
        fmha_dsl.loads(text).expand(arch="gfx942")
    rules = [d.rule for d in e.value.diagnostics]
    assert rule in rules, str(e.value)
    d = e.value.diagnostics[rules.index(rule)]
    for f in fragments:
        assert f in d.message, d.message
    assert d.span is not None and d.hint
    return d


def _kernels(text, arch="gfx942"):
    return fmha_dsl.loads(text).expand(arch=arch)


# --- values ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "kernel_set s { kernel { signature { family(fwd) dtype(fp16) hdim(" + "1" * 4301 + ") } } }",
    "kernel_set s { kernel { " + SIG + " where hdim_q == " + "1" * 4301 + " } }",
])
def test_an_integer_of_thousands_of_digits_is_a_located_error(text):
    _err(text, "value.range", "an integer literal of 4301 digits")


@pytest.mark.parametrize("depth", [17, 20, 300])
def test_values_nested_too_deep_are_a_located_error(depth):
    text = "kernel_set s { kernel { signature { family(fwd) dtype(fp16) hdim(" + "[" * depth + "128" + "]" * depth \
           + ") } } }"
    _err(text, "value.too-deep", "more than 16 deep")


@pytest.mark.parametrize("depth", [3, 16])
def test_values_nested_within_the_limit_still_work(depth):
    text = "kernel_set s { kernel { signature { family(fwd) dtype(fp16) hdim(" + "[" * depth + "128" + "]" * depth \
           + ") } } }"
    assert {k.signature.hdim_q for k in _kernels(text)} == {128}


@pytest.mark.parametrize("profile", ["1" * 4301, "\u0664", "-0", "04"])   # 4,301 digits; an Arabic-Indic 4; not as written
def test_profiles_spelt_as_odd_digits_are_unknown_profiles(profile):
    _err(f'kernel_set s {{ profile("{profile}") kernel {{ {SIG} }} }}', "value.unknown", "unknown profile")


def test_a_receipt_number_as_text_still_names_its_profile():
    a = _kernels(f'kernel_set s {{ profile("4") kernel {{ {SIG} }} }}')
    b = _kernels(f"kernel_set s {{ profile(pytorch) kernel {{ {SIG} }} }}")
    assert [k.identifier for k in a] == [k.identifier for k in b] and a


@pytest.mark.parametrize("setter", ['mask_impl(simplified | generic)', "backend(ck | triton)",
                                    "profile(ck_default | pytorch)", 'constraint("a" | "b")', "mask_impl(*)",
                                    "backend(*)", "backend([ck, triton])"])
def test_setters_of_one_value_refuse_alternatives(setter):
    _err(f"kernel_set s {{ {setter} kernel {{ {SIG} }} }}", "value.single", "takes one value")


@pytest.mark.parametrize("setter", ["family([])", "dtype([])", "hdim([])"])
def test_an_empty_list_is_a_located_error(setter):
    text = f"kernel_set s {{ kernel {{ signature {{ family(fwd) dtype(fp16) hdim(128) }} }} " \
           f"kernel {{ signature {{ {setter} }} }} }}"
    if setter != "family([])":
        text = "kernel_set s { kernel { signature { family(fwd) " + ("dtype(fp16) " if "dtype" not in setter else "") \
               + setter + (" hdim(128)" if "hdim" not in setter else "") + " } } }"
    _err(text, "value.empty", "an empty list selects no value")


@pytest.mark.parametrize("arch", ["arch([])", "arch(gfx942, [])", "arch(gfx942 | [])"])
def test_an_empty_arch_list_is_a_located_error_not_a_crash(arch):
    _err(f"kernel_set s {{ {arch} kernel {{ {SIG} }} }}", "value.empty", "an empty list selects no arch")


@pytest.mark.parametrize("wave", ["wave(0, 0, 0)", "wave(4, 1, 1, 0, 1, 1)", "warp(32, 32, 0)", "wave_m0(0)"])
def test_explicit_warp_counts_must_be_positive(wave):
    text = (f"kernel_set s {{ kernel {{ {SIG} algorithm {{ pipeline(qr_async) "
            f"tile(128, 128, 32, 128, 32, 128) {wave} }} }} }}")
    _err(text, "value.range", "must be >= 1, got 0")


def test_page_size_set_twice_through_kv_cache_is_a_duplicate():
    text = ("kernel_set s { kernel { signature { family(batch_prefill) dtype(fp16) hdim(128) "
            "kv_cache(linear, vllm, 16) page_size(1024) } } }")
    _err(text, "setter.duplicate", "the page size is set twice")


def test_single_quoted_strings_escape_their_quote():
    text = "kernel_set s { kernel { " + SIG + " algorithm { constraint('it\\'s') } } }"
    assert {k.algorithm.constraint for k in _kernels(text)} == {"it's"}
    assert {k.algorithm.constraint for k in _kernels(format_source(text))} == {"it's"}


def test_unknown_escapes_keep_their_backslash_and_fmt_round_trips_them():
    text = 'kernel_set s { kernel { ' + SIG + ' algorithm { constraint("C:\\q\\x \\"y\\"") } } }'
    src = fmha_dsl.loads(text)
    assert {k.algorithm.constraint for k in src.expand(arch="gfx942")} == {'C:\\q\\x "y"'}
    again = fmha_dsl.loads(format_source(text))
    assert {k.algorithm.constraint for k in again.expand(arch="gfx942")} == {'C:\\q\\x "y"'}


# --- where -------------------------------------------------------------------------------------------------------
def test_a_tile_dimension_a_kernel_lacks_reads_as_zero():
    base = "kernel_set s { backend(triton) arch(sm90) kernel { signature { family(bwd_dot_do_o) } %s } }"
    assert len(_kernels(base % "where tile_k1 >= 0", "sm90")) == len(_kernels(base % "", "sm90")) > 0
    with pytest.raises(FmhaError) as e:   # (0, so `> 0` drops every 1-d stage kernel: an empty declaration)
        _kernels(base % "where tile_k1 > 0", "sm90")
    assert e.value.rule == "decl.empty"


@pytest.mark.parametrize("clause,text", [
    ("hdim_q in [fp16, 128]", "this list holds a str where `hdim_q` is an int"),
    ('lse not in [1, "bf16"]', "this list holds an int where `lse` is a bool"),
    ("dtype in [128]", "this list holds an int where `dtype` is a str"),
])
def test_where_in_lists_are_type_checked(clause, text):
    _err("kernel_set s { kernel { signature { family(fwd) dtype(fp16) hdim(128) lse(*) } where " + clause
         + " } }", "where.type", text)


def test_factory_names_are_known_bare_words():
    text = "kernel_set s { arch(gfx942, sm90) kernel { " + SIG + " where factory == %s } }"
    bare, quoted = fmha_dsl.loads(text % "gfx9"), fmha_dsl.loads(text % '"gfx9"')
    assert [k.identifier for k in bare.expand()] == [k.identifier for k in quoted.expand()]
    assert {k.arch for k in bare.expand()} == {"gfx942"}


def test_nested_values_are_shown_once_in_the_languages_spelling():
    d = _err(f"kernel_set s {{ kernel {{ {SIG} algorithm {{ pipeline(((1, 2), [a, \"b\"])) }} }} }}", "value.type")
    assert "the tuple `((1, 2), [a, \"b\"])`" in d.message, d.message


def test_values_are_shown_in_the_languages_spelling():
    d = _err(f"kernel_set s {{ kernel {{ {SIG} arch(true) }} }}", "value.unknown", "unknown arch `true`")
    assert "True" not in d.message
    text = "kernel_set s { .add(FmhaSignature().family(fwd).dtype(fp16).hdim(128), FmhaAlgorithm(), (gfx942, sm90)) }"
    _err(text, "value.unknown", "unknown arch the tuple `(gfx942, sm90)`")


# --- files -------------------------------------------------------------------------------------------------------
def test_including_a_device_is_refused_without_reading_it(tmp_path):
    f = tmp_path / "dev.fmha"
    f.write_text('include "/dev/zero"\n')
    with pytest.raises(FmhaError) as e:
        fmha_dsl.load(f)
    assert e.value.rule == "input.unreadable" and "not a regular file" in str(e.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_including_a_fifo_does_not_hang(tmp_path):
    os.mkfifo(tmp_path / "p")
    (tmp_path / "f.fmha").write_text('include "p"\n')
    got = []
    t = threading.Thread(target=lambda: got.append(_catch(lambda: fmha_dsl.load(tmp_path / "f.fmha"))), daemon=True)
    t.start()
    t.join(20)
    assert got and got[0] == "input.unreadable"


def _catch(fn):
    try:
        fn()
    except FmhaError as e:
        return e.rule
    return None


def test_the_file_on_the_command_line_may_be_a_pipe():
    """`fmha-dsl fmt /dev/stdin` works as an editor's filter (only an include must name a regular file)."""
    text = "kernel_set s {\n    kernel { " + SIG + " }\n}\n"
    for cmd in (["fmt", "/dev/stdin"], ["check", "/dev/stdin", "--arch", "gfx942"]):
        r = subprocess.run([sys.executable, "-m", "fmha_dsl.cli", *cmd], input=text, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok: s: 1 declarations")


def test_the_cli_exits_2_on_these_inputs(tmp_path):
    f = tmp_path / "big.fmha"
    f.write_text("kernel_set s { kernel { signature { family(fwd) dtype(fp16) hdim(" + "1" * 4301 + ") } } }\n")
    for cmd in (["check", str(f)], ["fmt", str(f)], ["check", "serving", "--profile", "1" * 4400]):
        r = subprocess.run([sys.executable, "-m", "fmha_dsl.cli", *cmd], capture_output=True, text=True)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (cmd, r.stderr[-500:])


# --- fmt: comments stay with what they annotate, idempotently ---------------------------------------------------
FMT_CASES = [
    # a set-level setter written after the kernels moves up; the kernel's comment stays in the kernel
    ("kernel_set s {\n    kernel a {\n        signature {\n            family(fwd)\n            dtype(fp16)  # fp16 only\n"
     "            hdim(128)\n        }\n    }\n    arch(gfx942)\n}\n",
     "kernel_set s {\n    arch(gfx942)\n\n    kernel a {\n        signature {\n            family(fwd)\n"
     "            dtype(fp16)  # fp16 only\n            hdim(128)\n        }\n    }\n}\n"),
    # a comment inside a multi-line argument list trails its setter; one before a block's `}` stays in the block
    ("kernel_set s {\n    kernel a {\n        signature {\n            family(fwd)\n            hdim(128,   # q\n"
     "                 128)\n            dtype(fp16)\n            # end of signature\n        }\n"
     "        algorithm {\n            pipeline(qr_async)\n        }\n    }\n}\n",
     "kernel_set s {\n    kernel a {\n        signature {\n            family(fwd)\n            hdim(128, 128)  # q\n"
     "            dtype(fp16)\n            # end of signature\n        }\n        algorithm {\n"
     "            pipeline(qr_async)\n        }\n    }\n}\n"),
    # several statements on one line: a comment trails the one before it
    ("kernel_set s { kernel { signature { family(fwd) dtype(fp16) /* fp16 only */ hdim(128) } } }\n",
     "kernel_set s {\n    kernel {\n        signature {\n            family(fwd)\n            dtype(fp16)  /* fp16 only */\n"
     "            hdim(128)\n        }\n    }\n}\n"),
    # a trailing block comment over two lines, then a setter on its last line
    ("kernel_set s {\n    kernel {\n        signature {\n            family(fwd) /* a\n            b */ dtype(fp16)\n"
     "        }\n    }\n}\n",
     "kernel_set s {\n    kernel {\n        signature {\n            family(fwd)  /* a\n            b */\n"
     "            dtype(fp16)\n        }\n    }\n}\n"),
    # comments in a multi-line where clause trail it, each line comment on a line of its own (never merged into one)
    ("kernel_set s {\n    kernel a {\n        signature { family(fwd) dtype(fp16) hdim(128) lse(*) }\n"
     "        where hdim_q == 128   # first\n          and lse             # second\n    }\n}\n",
     "kernel_set s {\n    kernel a {\n        signature {\n            family(fwd)\n            dtype(fp16)\n"
     "            hdim(128)\n            lse(*)\n        }\n        where hdim_q == 128 and lse  # first\n"
     "        # second\n    }\n}\n"),
    # the same in a setter's argument list; in an .add(...) line each comment stays with its setter
    ("kernel_set s {\n    kernel {\n        signature {\n            family(fwd)\n            dtype(fp16 |  # half\n"
     "                  bf16)   /* b */ // brain\n            hdim(128)\n        }\n    }\n"
     "    .add(FmhaSignature().family(fwd).dtype(fp16)  # one\n         .hdim(128),\n"
     "         FmhaAlgorithm().pipeline(qr_async).tile(128, 128, 32, 128, 32, 128))  # two\n}\n",
     "kernel_set s {\n    kernel {\n        signature {\n            family(fwd)\n            dtype(fp16 | bf16)  # half\n"
     "            /* b */\n            // brain\n            hdim(128)\n        }\n    }\n\n    kernel {  # two\n"
     "        signature {\n            family(fwd)\n            dtype(fp16)  # one\n            hdim(128)\n        }\n"
     "        algorithm {\n            pipeline(qr_async)\n            tile(128, 128, 32, 128, 32, 128)\n        }\n"
     "    }\n}\n"),
    # a block comment over several lines trailing a statement: the comments after it get lines of their own
    ("kernel_set s {\n    kernel a {\n        signature { family(fwd) dtype(fp16) hdim(128) lse(*) }\n"
     "        where /* multi\n   line */  hdim_q == 128   # first\n          and lse == false    # second\n    }\n}\n",
     "kernel_set s {\n    kernel a {\n        signature {\n            family(fwd)\n            dtype(fp16)\n"
     "            hdim(128)\n            lse(*)\n        }\n        where hdim_q == 128 and lse == false  /* multi\n"
     "   line */\n        # first\n        # second\n    }\n}\n"),
    # statements that shared a line get no blank line between them; a trailing comment ending in `{` opens nothing
    ("kernel_set s {\n\n    arch(gfx942) dtype(fp16)  # {\n\n    mode(batch)\n    kernel { " + SIG + " }\n}\n",
     "kernel_set s {\n    arch(gfx942)\n    dtype(fp16)  # {\n\n    mode(batch)\n\n    kernel {\n        signature {\n"
     "            family(fwd)\n            dtype(fp16)\n            hdim(128)\n        }\n    }\n}\n"),
    # a comment inside a multi-line .add(...) trails its kernel's statement; CRLF inside a block comment becomes LF;
    # blank lines between comments after the last statement stay
    ("kernel_set s {\r\n    .add(FmhaSignature().family(fwd).dtype(fp16).hdim(128),\r\n"
     "         FmhaAlgorithm().pipeline(qr_async).tile(128, 128, 32, 128, 32, 128) /* x\r\n y */\r\n    )\r\n}\r\n"
     "# a\r\n\r\n# b\r\n",
     "kernel_set s {\n    kernel {\n        signature {\n            family(fwd)\n            dtype(fp16)\n"
     "            hdim(128)\n        }\n        algorithm {\n            pipeline(qr_async)\n"
     "            tile(128, 128, 32, 128, 32, 128)  /* x\n y */\n        }\n    }\n}\n# a\n\n# b\n"),
    # header comments, a blank line, then the set (kept); a comment after a closing brace trails it
    ("# about this set\n\nkernel_set s {\n    kernel { " + SIG + " }  # the only one\n}\n",
     "# about this set\n\nkernel_set s {\n    kernel {\n        signature {\n            family(fwd)\n"
     "            dtype(fp16)\n            hdim(128)\n        }\n    }  # the only one\n}\n"),
]


@pytest.mark.parametrize("src,want", FMT_CASES)
def test_fmt_keeps_comments_with_what_they_annotate(src, want):
    got = format_source(src)
    assert got == want
    assert format_source(got) == got
    assert [k.identifier for k in fmha_dsl.loads(got).expand(arch="gfx942")] == \
        [k.identifier for k in fmha_dsl.loads(src).expand(arch="gfx942")]


@pytest.mark.parametrize("family", ["fwd_appendkv", "fwd_pagedkv", "batch_prefill", "bwd_dot_do_o", "fwd"])
def test_fmt_of_an_add_line_keeps_a_fixed_pipeline_family_valid(family):
    src = f"kernel_set s {{\n    .add(FmhaSignature().family({family}).dtype(fp16).hdim(128), FmhaAlgorithm())\n}}\n"
    out = format_source(src)
    if family != "fwd":
        assert "pipeline(" not in out
    for text in (src, out):   # the same kernels, or the same error
        try:
            got = [k.identifier for k in fmha_dsl.loads(text).expand(arch="gfx942")]
        except FmhaError as e:
            got = e.rule
        if text is src:
            want = got
    assert got == want


def test_fmt_keeps_a_keyword_named_setter_a_setter():
    """`.where(...)` in an .add chain is an unknown setter; written in a block it keeps its dot (without it the line
    would be a where clause: a syntax error), so the formatted file says the same thing."""
    src = ("kernel_set s {\n    .add(FmhaSignature().family(fwd).dtype(fp16).hdim(128), "
           "FmhaAlgorithm().pipeline(qr).where(4, 1, 1))\n}\n")
    out = format_source(src)
    assert "            .where(4, 1, 1)\n" in out and format_source(out) == out
    for text in (src, out):
        with pytest.raises(FmhaError) as e:
            fmha_dsl.loads(text).expand(arch="gfx942")
        assert e.value.rule == "setter.unknown" and "unknown setter `where`" in str(e.value)

