#!/usr/bin/env python3
"""Regenerates tests/fixtures/templates/*.cases.json: the expected renderings
of each family's chat template (tests/fixtures/templates/<family>.jinja) for a
set of conversations, produced by Python jinja2 set up exactly the way Hugging
Face transformers sets it up in apply_chat_template:

  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[AssistantTracker, loopcontrols])
  filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=indent,
                                 separators=separators, sort_keys=sort_keys)
  globals["raise_exception"] raises TemplateError(message)
  globals["strftime_now"] = datetime.now().strftime (a fixed clock here)
  render(messages=..., tools=None or a list, documents=None,
         add_generation_prompt=..., bos_token=..., eos_token=...)

It also writes constructs.json: small templates, one jinja2 construct each
(whitespace control, loops, set/namespace, operators, tests, filters, tojson),
with jinja2's output.

Only for generating committed fixtures (CI has no jinja2):
  python3 scripts/make_template_fixtures.py
The C++ test (tests/template/chat_fixture_test.cpp) renders the same cases
with our interpreter and compares bytes.
"""

import datetime
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures", "templates")
NOW_UNIX_S = 1721952000  # 2024-07-26 00:00:00 UTC

# Each family's special tokens, as its tokenizer_config.json names them.
FAMILIES = {
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama31": ("<|begin_of_text|>", "<|eot_id|>"),
    "chatml": ("<s>", "<|im_end|>"),
    "qwen25": ("<|endoftext|>", "<|im_end|>"),
    "mistral": ("<s>", "</s>"),
    "mistral_v03": ("<s>", "</s>"),
    "gemma": ("<bos>", "<eos>"),
    "phi3": ("<s>", "<|endoftext|>"),
    "zephyr": ("<s>", "</s>"),
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    # Not built in; more constructs (string split, `in`, tools=None handling),
    # from llama.cpp's models/templates/.
    "deepseek_r1_distill": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "phi4_mini": ("<|endoftext|>", "<|endoftext|>"),
}

TRICKY = ("Quotes ' and \" and a \\ backslash; unicode: é ß 中文 👋🏽 e\u0301; "
          "tabs\tand\nnew\nlines; a fake <|eot_id|> and {{ braces }} {% raw %}")

TOOL_CALL = {
    "id": "abc123def",
    "type": "function",
    "function": {"name": "get_weather",
                 "arguments": {"city": "Paris", "unit": "°C", "days": 3, "ratio": 0.5,
                               "flags": [True, None], "note": "say \"hi\"\n"}},
}

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city (°C)",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "The city"}},
                       "required": ["city"]},
    },
}]

CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke."}],
    "multi_turn_no_system": [{"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": "Hello there."},
                             {"role": "user", "content": "Bye"}],
    "tricky_content": [{"role": "system", "content": "  " + TRICKY + "  "},
                       {"role": "user", "content": TRICKY},
                       {"role": "assistant", "content": "\n  padded answer  \n"},
                       {"role": "user", "content": "  \u00a0 spaces \u3000"}],
    "empty_content": [{"role": "user", "content": ""}],
    "bad_alternation": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
    "assistant_first": [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}],
    "tool_round_trip": [{"role": "user", "content": "Weather in Paris?"},
                        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                        {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "abc123def"},
                        {"role": "assistant", "content": "It is 21 °C."}],
    "unknown_role": [{"role": "narrator", "content": "Once upon a time"}, {"role": "user", "content": "go on"}],
}


# Construct by construct: (name, template source, variables), per section.
CONSTRUCTS = {
"text and expressions": [
 ("plain text", "hello world", {}),
 ("variable", "Hi {{ name }}!", {"name": "Ann"}),
 ("undefined prints empty", "[{{ missing }}]", {}),
 ("none prints None", "{{ none }} {{ x }}", {"x": None}),
 ("bools print True/False", "{{ true }} {{ false }} {{ True }}", {}),
 ("ints and floats", "{{ 1 }} {{ 2.5 }} {{ 1e3 }} {{ 1_000 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-5 }} {{ 3.0 }}", {}),
 ("list and dict repr", "{{ [1, 'a', none, true, 2.0] }} {{ {'k': 'v', 'n': [1]} }}", {}),
 ("string repr quoting", "{{ [\"it's\", 'say \"hi\"', 'tab\\there'] }}", {}),
 ("string escapes", "{{ 'a\\nb\\tc\\\\d\\'e' }}|{{ \"\\u00e9\\x41\" }}", {}),
 ("adjacent string literals join", "{{ 'ab' 'cd' }}", {}),
 ("comments vanish", "a{# a comment #}b", {}),
 ("unicode passthrough", "{{ s }}", {"s": "héllo 中文 👋"}),
 ("trailing newline dropped", "x\n", {}),
 ("only one trailing newline dropped", "x\n\n", {}),
 ("crlf normalized", "a\r\nb\rc", {}),
],
"whitespace control": [
 ("minus strips both sides", "a  \n  {{- 'x' -}}  \n  b", {}),
 ("block minus", "a \n {%- if true -%} \n b \n {%- endif -%} \n c", {}),
 ("trim_blocks drops newline after block", "{% if true %}\nyes\n{% endif %}\nafter", {}),
 ("trim_blocks not after variable", "{{ 'v' }}\nnext", {}),
 ("lstrip_blocks strips indentation", "<\n    {% if true %}\n    in\n    {% endif %}\n>", {}),
 ("lstrip_blocks leaves text before tag", "x {% if true %}y{% endif %}", {}),
 ("plus disables lstrip", "a\n    {%+ if true %}b{% endif %}", {}),
 ("plus disables trim", "{% if true +%}\nkept{% endif %}", {}),
 ("comment trim and lstrip", "a\n  {# c #}\nb", {}),
 ("minus comment", "a  {#- c -#}  b", {}),
 ("variable not lstripped", "a\n    {{ 'v' }}", {}),
 ("loop with indentation", "{% for i in [1,2] %}\n  - {{ i }}\n{% endfor %}\nend", {}),
],
"for loops": [
 ("loop variables", "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}", {"xs": ["a","b","c"]}),
 ("for else on empty", "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}", {}),
 ("for else skipped", "{% for x in [1] %}{{ x }}{% else %}empty{% endfor %}", {}),
 ("dict iteration yields keys", "{% for k in d %}{{ k }},{% endfor %}", {"d": {"b": 1, "a": 2}}),
 ("items unpacking", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": [2]}}),
 ("items filter", "{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}", {"d": {"x": "y"}}),
 ("loop filter", "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{{ loop.last }} {% endfor %}", {"xs": [1,2,3]}),
 ("string iteration", "{% for c in 'héj' %}[{{ c }}]{% endfor %}", {}),
 ("undefined iterates empty", "{% for x in nothing %}x{% else %}none{% endfor %}", {}),
 ("nested loops and outer loop", "{% for a in [1,2] %}{% set outer = loop %}{% for b in 'xy' %}{{ outer.index }}{{ b }}{{ loop.index }} {% endfor %}{% endfor %}", {}),
 ("set inside loop does not leak", "{% set n = 0 %}{% for x in [1,2,3] %}{% set n = n + x %}{{ n }}{% endfor %}|{{ n }}", {}),
 ("break and continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
 ("previtem nextitem", "{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }} {% endfor %}", {}),
 ("range forms", "{{ range(3) | list }} {{ range(1, 4) | list }} {{ range(5, 0, -2) | list }}", {}),
],
"if and set": [
 ("if elif else", "{% for x in [1,2,3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %} {% endfor %}", {}),
 ("truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, none] %}{{ 'T' if v else 'F' }}{% endfor %}", {}),
 ("set leaks out of if", "{% if true %}{% set x = 'in' %}{% endif %}{{ x }}", {}),
 ("set tuple", "{% set a, b = [1, 2] %}{{ a }}{{ b }}", {}),
 ("set tuple literal", "{% set t = 1, 2 %}{{ t }}", {}),
 ("block set", "{% set body %}hi {{ name }}{% endset %}[{{ body }}]", {"name": "Bo"}),
 ("namespace", "{% set ns = namespace(n=0, found=false) %}{% for x in [1,2,3] %}{% set ns.n = ns.n + x %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.n }} {{ ns.found }}", {}),
 ("namespace new attribute", "{% set ns = namespace() %}{% set ns.index = 0 %}{% set ns.index = ns.index + 1 %}{{ ns.index }}", {}),
 ("ternary without else is undefined", "[{{ 'a' if false }}]", {}),
 ("set shadows variable", "{% set messages = messages[1:] %}{{ messages | length }}", {"messages": [1,2,3]}),
 ("generation block", "a{% generation %}b{{ 1 }}{% endgeneration %}c", {}),
],
"operators": [
 ("arithmetic", "{{ 7 + 2 }} {{ 7 - 2 }} {{ 7 * 2 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ 7 % 2 }} {{ -7 // 2 }} {{ -7 % 2 }} {{ 2 ** 10 }} {{ 6 / 3 }}", {}),
 ("float arithmetic", "{{ 1.5 + 1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 / 3 }}", {}),
 ("string concat and repeat", "{{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ 2 * 'x' }} {{ [1] + [2] }} {{ [0] * 2 }}", {}),
 ("tilde concat", "{{ 'n=' ~ 1 ~ none ~ true ~ missing }}", {}),
 ("comparisons", "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}", {}),
 ("equality of containers", "{{ [1, {'a': 2}] == [1, {'a': 2}] }} {{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ missing == missing }} {{ missing == none }}", {}),
 ("and or not", "{{ 1 and 'x' }} {{ 0 and 'x' }} {{ 0 or 'y' }} {{ 'a' or 'b' }} {{ not 0 }} {{ not 'a' }}", {}),
 ("in and not in", "{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'cat' }} {{ 'x' in missing }}", {}),
 ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 'x' ~ 2 * 3 }} {{ not 1 == 2 }}", {}),
 ("filter binds tighter than plus", "{{ 'x' + s | trim + 'y' }}", {"s": "  mid  "}),
 ("subscripts", "{{ xs[0] }} {{ xs[-1] }} {{ d['k'] }} {{ d.k }} {{ xs[5] }}|{{ s[1] }} {{ s[-1] }}", {"xs": [1,2,3], "d": {"k": "v"}, "s": "héllo"}),
 ("slices", "{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[5:] }} {{ s[::-1] }} {{ s[1:3] }}", {"xs": [1,2,3,4], "s": "héllo"}),
 ("attribute of dict missing is undefined", "[{{ d.nope }}] {{ d.nope is defined }}", {"d": {}}),
 ("dict methods", "{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 9) }}", {"d": {"a": 1, "b": 2}}),
 ("method named like a key", "{{ d['items'] }} {{ d.items() | length }}", {"d": {"items": "own"}}),
 ("dotted integer index", "{{ xs.0 }} {{ xs.1.0 }}", {"xs": ["a", ["b"]]}),
],
"tests": [
 ("defined undefined", "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ x is not defined }}", {"x": 1}),
 ("type tests", "{{ 'a' is string }} {{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ {} is mapping }} {{ [] is mapping }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ [] is sequence }} {{ none is none }} {{ 0 is none }} {{ true is boolean }} {{ 1 is integer }} {{ 1.0 is float }}", {}),
 ("undefined is iterable", "{{ nope is iterable }} {{ nope is sequence }} {{ nope is mapping }}", {}),
 ("value tests", "{{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }} {{ 'a' is equalto 'a' }} {{ 1 is eq 2 }} {{ false is sameas false }} {{ 2 is in [1, 2] }} {{ 'abc' is lower }} {{ 'ABC' is upper }}", {}),
 ("is not none", "{{ x is not none }} {{ y is not none }}", {"x": None, "y": 0}),
 ("true false tests", "{{ true is true }} {{ 1 is true }} {{ false is false }}", {}),
],
"string methods": [
 ("strip family", "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxaxx'.strip('x') }}]", {"s": " \t a b \n"}),
 ("unicode whitespace strip", "[{{ s.strip() }}]", {"s": "\u00a0\u3000 text \u2028"}),
 ("split", "{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a b c'.split(' ', 1) }} {{ '  '.split() }}", {}),
 ("startswith endswith", "{{ s.startswith('he') }} {{ s.endswith('lo') }} {{ s.startswith(('x', 'h')) }} {{ s.endswith('x') }}", {"s": "hello"}),
 ("case", "{{ 'MiXed wOrd'.upper() }} {{ 'MiXed wOrd'.lower() }} {{ 'hello wORLD-x'.title() }} {{ 'hELLO'.capitalize() }}", {}),
 ("replace", "{{ 'aaa'.replace('a', 'b') }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'ab'.replace('', '-') }}", {}),
 ("find count join", "{{ 'héllo'.find('l') }} {{ 'héllo'.find('z') }} {{ 'banana'.count('an') }} {{ ', '.join(['a', 'b']) }}", {}),
 ("format", "{{ '{} and {}'.format('a', 1) }} {{ '{0}{0}'.format('x') }} {{ '{name}!'.format(name='hi') }}", {}),
 ("splitlines", "{{ 'a\\nb\\r\\nc\\n'.splitlines() }}", {}),
],
"filters": [
 ("trim", "[{{ s | trim }}] [{{ 'xxhixx' | trim('x') }}] [{{ none | trim }}] [{{ nope | trim }}]", {"s": "\n  hi  \t"}),
 ("length", "{{ 'héllo' | length }} {{ [1, 2] | length }} {{ {'a': 1} | length }} {{ nope | length }} {{ [1,2,3] | count }}", {}),
 ("upper lower capitalize title", "{{ 'ab' | upper }} {{ 'AB' | lower }} {{ 'hELLO world' | capitalize }} {{ 'hello wORLD-x(y' | title }}", {}),
 ("default", "{{ nope | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ none | default('d') }} {{ nope | d('x') }} [{{ nope | default }}]", {}),
 ("join", "{{ [1, 'a', none] | join }} {{ ['a', 'b'] | join(', ') }} {{ users | join(', ', attribute='name') }}", {"users": [{"name": "A"}, {"name": "B"}]}),
 ("first last", "{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | first }} [{{ [] | first }}]", {}),
 ("list string int float", "{{ 'ab' | list }} {{ 12 | string }} {{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ true | int }}", {}),
 ("replace filter", "{{ 'a-b-c' | replace('-', '+') }} {{ 'a-b-c' | replace('-', '', 1) }}", {}),
 ("indent", "[{{ 'a\\nb\\n\\nc' | indent }}] [{{ 'a\\nb' | indent(2, true) }}] [{{ 'a\\n\\nb' | indent(2, blank=true) }}] [{{ 'a\\nb' | indent('> ') }}]", {}),
 ("selectattr rejectattr", "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ ms | rejectattr('role', 'equalto', 'user') | list | length }} {{ ms | selectattr('flag') | list | length }}", {"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "flag": True}, {"role": "user", "content": "c"}]}),
 ("select reject map", "{{ [1, 2, 3, 4] | select('even') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ ['a', 'b'] | map('upper') | list }} {{ [0, 1, ''] | select | list }}", {}),
 ("reject equalto", "{{ ['a', 'code_interpreter', 'b'] | reject('equalto', 'code_interpreter') | join(', ') }}", {}),
 ("escape safe reverse abs", "{{ '<a href=\"x\">&\\'' | escape }} {{ 'x' | safe }} {{ [1, 2] | reverse | list }} {{ 'abc' | reverse }} {{ -3 | abs }}", {}),
],
"tojson": [
 ("scalars", "{{ 1 | tojson }} {{ 1.5 | tojson }} {{ 'a\"b' | tojson }} {{ true | tojson }} {{ none | tojson }} {{ 1e20 | tojson }}", {}),
 ("non-ascii kept and controls escaped", "{{ s | tojson }}", {"s": "é 中 👋 \n\t\u0001 \\ / <>&'"}),
 ("containers keep key order", "{{ d | tojson }}", {"d": {"z": 1, "a": [1, 2.0, None, True], "m": {}, "l": []}}),
 ("indent", "{{ d | tojson(indent=2) }}", {"d": {"z": 1, "a": [1, {"b": "c"}], "m": {}, "l": []}}),
 ("indent string and separators", "{{ d | tojson(indent='\\t') }}|{{ d | tojson(separators=(',', ':')) }}", {"d": {"a": [1, 2]}}),
 ("sort_keys", "{{ d | tojson(sort_keys=true) }}", {"d": {"b": 1, "a": 2}}),
 ("large ints and floats", "{{ [12345678901234, 0.1, 1e-7, 100.0, -0.0] | tojson }}", {}),
],
"globals": [
 ("strftime_now fixed clock", "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d %H:%M') }}", {}),
 ("dict global", "{{ dict(a=1, b='x') | tojson }}", {}),
 ("raise_exception", "{% if x %}{{ raise_exception('Bad thing: ' ~ x) }}{% endif %}ok", {"x": 0}),
],
}


class AssistantTracker(Extension):
    """transformers' {% generation %} block, rendering its body as is."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW_UNIX_S, datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_case(template, bos, eos, messages, add_generation_prompt, tools):
    try:
        out = template.render(messages=messages, tools=tools, documents=None,
                              add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos)
        return {"expected": out}
    except jinja2.exceptions.TemplateError as e:
        # raise_exception gives a bare TemplateError; jinja2's own failures are subclasses.
        kind = "raise" if type(e) is jinja2.exceptions.TemplateError else type(e).__name__
        return {"error": str(e), "error_kind": kind}
    except Exception as e:  # a TypeError from Python operators, etc.
        return {"error": str(e), "error_kind": type(e).__name__}


def main():
    env = make_env()
    total = 0
    for family, (bos, eos) in FAMILIES.items():
        with open(os.path.join(FIXTURES, family + ".jinja"), encoding="utf-8", newline="") as f:
            source = f.read()
        template = env.from_string(source)
        cases = []
        for name, messages in CONVERSATIONS.items():
            for agp in (True, False):
                case = {"name": f"{name}/{'gen' if agp else 'nogen'}", "messages": messages,
                        "add_generation_prompt": agp, "tools": None}
                case.update(render_case(template, bos, eos, messages, agp, None))
                cases.append(case)
        # Templates that describe tools (Llama 3.1, Qwen2.5, Mistral v0.3) exercise tojson with indent.
        case = {"name": "with_tools/gen", "messages": CONVERSATIONS["system_user"], "add_generation_prompt": True,
                "tools": TOOLS}
        case.update(render_case(template, bos, eos, case["messages"], True, TOOLS))
        cases.append(case)
        doc = {
            "generator": f"scripts/make_template_fixtures.py with Python jinja2 {jinja2.__version__} "
                         "configured as transformers' apply_chat_template",
            "template": family + ".jinja",
            "bos_token": bos,
            "eos_token": eos,
            "now_unix_s": NOW_UNIX_S,
            "cases": cases,
        }
        with open(os.path.join(FIXTURES, family + ".cases.json"), "w", encoding="utf-8", newline="\n") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        total += len(cases)
        ok = sum(1 for c in cases if "expected" in c)
        print(f"{family}: {len(cases)} cases ({ok} render, {len(cases) - ok} raise)")
    print(f"total {total} cases")

    constructs = []
    for section, cases in CONSTRUCTS.items():
        for name, source, variables in cases:
            # Every construct case renders (errors are tested by hand in C++).
            out = env.from_string(source).render(**variables)
            constructs.append({"section": section, "name": name, "source": source, "variables": variables,
                               "expected": out})
    doc = {"generator": f"scripts/make_template_fixtures.py with Python jinja2 {jinja2.__version__}",
           "now_unix_s": NOW_UNIX_S, "cases": constructs}
    with open(os.path.join(FIXTURES, "constructs.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"constructs: {len(constructs)} cases")


if __name__ == "__main__":
    sys.exit(main())
