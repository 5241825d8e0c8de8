"""Questions with short known answers about real documents shipped by Debian packages (not by this project).

Each question is answerable from one page or line. ``answers``: regular expressions, any of which
(case-insensitive) in the answer counts as correct. ``pages``: 1-based PDF page indices as ``ingest`` numbers
them (the ``--- page N ---`` headers; libtasn1's printed labels differ: physical page = label + 3 in the body),
checked against the ingested text; where the fact is stated on more than one page, all of them are listed.
``lines``: for source code, the 1-based lines that state the fact (a cited chunk holds it when its line range
does).
"""

from __future__ import annotations

from dataclasses import dataclass

MIME_SPEC = "/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf"  # 17 pages, ~9.7K tokens
LIBTASN1 = "/usr/share/doc/libtasn1-doc/libtasn1.pdf"  # 36 pages, ~21.6K tokens
ARGPARSE = "/usr/lib/python3.11/argparse.py"  # Debian's python3.11: 2,633 lines, ~22K tokens


@dataclass(frozen=True)
class Question:
    document: str
    question: str
    answers: tuple[str, ...]
    pages: tuple[int, ...]
    lines: tuple[int, ...] = ()

    def holds(self, passage) -> bool:
        """Whether a cited passage (a PDF page, or a text chunk's ``[first, last]`` lines) states the answer."""
        if isinstance(passage, (tuple, list)):
            return any(passage[0] <= line <= passage[1] for line in self.lines)
        return passage in self.pages


def _q(document, question, answers, pages) -> Question:
    return Question(document, question, tuple(answers), tuple(pages))


def _code(document, question, answers, lines) -> Question:
    return Question(document, question, tuple(answers), (), tuple(lines))


QUESTIONS: tuple[Question, ...] = (
    # -- shared-mime-info-spec.pdf ------------------------------------------------------------------------
    _q(MIME_SPEC, "Which version of the Shared MIME-info Database specification is this?", [r"0\.21"], [1]),
    _q(MIME_SPEC, "Who is the author of the Shared MIME-info Database specification?", [r"Thomas Leonard"], [1]),
    _q(MIME_SPEC, "On what date was the specification last updated?", [r"October 2018", r"2018-10-02"], [1]),
    _q(MIME_SPEC, "Which RFC defines the key words MUST, SHOULD and MAY used in the specification?",
       [r"2119"], [2]),
    _q(MIME_SPEC, "Which command must an application run after installing or modifying its XML file in the "
                  "packages directory?", [r"update-mime-database", r"update_mime_database"], [3]),
    _q(MIME_SPEC, "Which file name takes precedence over all other files in the same packages directory?",
       [r"Override\.xml", r"Override"], [3, 17]),
    _q(MIME_SPEC, "What is the default weight value of a glob element?", [r"\b50\b"], [4]),
    _q(MIME_SPEC, "What alias does audio/midi have?", [r"audio/x-midi", r"x-midi"], [5]),
    _q(MIME_SPEC, "What is the name of the example source file given in the specification?", [r"diff\.xml"], [6]),
    _q(MIME_SPEC, "In the globs2 file, which character separates the weight, the MIME type and the pattern?",
       [r"colon", r"':'", r'":"', r"`:`", r"\(:\)"], [7]),
    _q(MIME_SPEC, "Which pattern is written into the globs2 file for a glob-deleteall element?",
       [r"NOGLOBS"], [8]),
    _q(MIME_SPEC, "With which magic string does the magic file start?", [r"MIME-Magic"], [9]),
    _q(MIME_SPEC, "Which value is written into the magic file for the magic-deleteall attribute?",
       [r"NOMAGIC"], [10]),
    _q(MIME_SPEC, "With which magic string does the treemagic file start?", [r"MIME-TreeMagic"], [10]),
    _q(MIME_SPEC, "In which byte order are all numbers in the mime.cache file stored?",
       [r"big[- ]endian", r"network"], [13]),
    _q(MIME_SPEC, "Which extended attribute may hold a file's MIME type?", [r"user\.mime_type", r"mime_type"], [14]),
    _q(MIME_SPEC, "All text/* types are subclasses of which type?", [r"text/plain"], [14]),
    _q(MIME_SPEC, "How many bytes at the start of a file should be checked for ASCII control characters to "
                  "guess whether it is binary or text?", [r"\b128\b"], [15]),
    _q(MIME_SPEC, "Which media type is provided for directories, sockets and device files?", [r"inode"], [15]),
    _q(MIME_SPEC, "Which mime-type do applications handle to handle a URI scheme such as mms:// or feed://?",
       [r"x-scheme-handler"], [16]),
    # -- libtasn1.pdf -------------------------------------------------------------------------------------
    _q(LIBTASN1, "Which version of Libtasn1 does this manual describe?", [r"4\.19"], [1, 2]),
    _q(LIBTASN1, "Which ITU-T recommendation specifies ASN.1 in this manual?", [r"X\.?680"], [4]),
    _q(LIBTASN1, "Under which license may the Libtasn1 library itself be used?",
       [r"Lesser General Public", r"LGPL"], [4]),
    _q(LIBTASN1, "With which characters do comments begin in the ASN.1 syntax accepted by the parser?",
       [r"--"], [5]),
    _q(LIBTASN1, "Which name indicates the last element of a SET OF or SEQUENCE OF?", [r"\?LAST", r"\bLAST\b"], [6]),
    _q(LIBTASN1, "Which ASN.1 type does this version of the library not handle?", [r"\bREAL\b"], [6, 7]),
    _q(LIBTASN1, "What is the name of the header file of the library?", [r"libtasn1\.h"], [7]),
    _q(LIBTASN1, "What does the -c option of asn1Parser do?", [r"check", r"syntax"], [8]),
    _q(LIBTASN1, "Which option of asn1Decoding performs a benchmark on decoding?", [r"-b\b", r"--benchmark"], [10]),
    _q(LIBTASN1, "Which function is used to start the parse algorithm for a file of ASN.1 declarations?",
       [r"asn1_parser2tree", r"parser2tree"], [11]),
    _q(LIBTASN1, "What does asn1_get_length_der return on indefinite length?", [r"-1\b", r"minus one"], [21]),
    _q(LIBTASN1, "Since which version does asn1_strerror exist?", [r"1\.6"], [26]),
    # -- argparse.py (source code: cited by line range) ---------------------------------------------------
    _code(ARGPARSE, "Which help formatter class retains any formatting in descriptions?",
          [r"RawDescriptionHelpFormatter"], [681, 682]),
    _code(ARGPARSE, "Which help formatter retains formatting of all help text?", [r"RawTextHelpFormatter"], [692, 693]),
    _code(ARGPARSE, "What is the default max_help_position of HelpFormatter?", [r"\b24\b"], [176]),
    _code(ARGPARSE, "With which exit status does ArgumentParser.error exit?", [r"\b2\b"], [2633]),
    _code(ARGPARSE, "Which exception is an error from trying to convert a command line string to a type?",
          [r"ArgumentTypeError"], [786, 787]),
    _code(ARGPARSE, "What is the value of the SUPPRESS constant?", [r"==SUPPRESS=="], [105]),
    _code(ARGPARSE, "Which class is a factory for creating file object types?", [r"FileType"], [1265, 1266]),
    _code(ARGPARSE, "Which function gives HelpFormatter its default width?", [r"get_terminal_size"], [183]),
    _code(ARGPARSE, "What is the default value of prefix_chars in ArgumentParser?",
          [r"'-'", r'"-"', r"\bhyphen", r"\bdash"], [1749]),
    _code(ARGPARSE, "Which method expands arguments that reference files?", [r"_read_args_from_files"], [2168, 2169]),
)
