#!/usr/bin/env python3
"""Python's str methods over every code point, and over strings that exercise context.

The reference for text/jinja/str_unicode_test.cc: the chat-template interpreter must map
case and classify characters as the Python that runs jinja2 does. Writes, to stdout:

  version <unicodedata.unidata_version>
  c <hex cp> <upper> <lower> <title> <swapcase> <flags>
  s <hex cps of the string> <upper> <lower> <title> <capitalize> <swapcase> <flags>

A mapping is its code points in hex joined by '.', or '=' when it is the input itself.
Flags are one letter per true test: a isalpha, l islower, u isupper, p isprintable,
s isspace. Surrogates are left out (UTF-8 cannot carry them). The strings are drawn, with
a fixed seed, from letters whose lowercase depends on context (capital sigma between
cased and case-ignorable characters), titlecase digraphs and multi-character mappings.
"""
import random
import sys
import unicodedata


def hexes(s):
    return ".".join("%x" % ord(ch) for ch in s)


def mapping(s, mapped):
    return "=" if mapped == s else (hexes(mapped) or "-")


def flags(s):
    tests = (("a", s.isalpha), ("l", s.islower), ("u", s.isupper), ("p", s.isprintable),
             ("s", s.isspace))
    return "".join(letter for letter, test in tests if test()) or "-"


def main():
    out = sys.stdout
    out.write("version %s\n" % unicodedata.unidata_version)
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        out.write("c %x %s %s %s %s %s\n" % (cp, mapping(c, c.upper()), mapping(c, c.lower()),
                                             mapping(c, c.title()), mapping(c, c.swapcase()),
                                             flags(c)))
    alphabet = ["\u03a3", "\u03c3", "A", "a", "\u01c5", "\u01c4", "\u00df", "\u0130", "\u0307",
                "'", ".", " ", "1", "\u00ad", "\u0149", "\ufb01", "\u1f80", "\u0391"]
    rng = random.Random(7)
    for _ in range(3000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7)))
        out.write("s %s %s %s %s %s %s %s\n" % (hexes(s), mapping(s, s.upper()),
                                                mapping(s, s.lower()), mapping(s, s.title()),
                                                mapping(s, s.capitalize()),
                                                mapping(s, s.swapcase()), flags(s)))


if __name__ == "__main__":
    main()
