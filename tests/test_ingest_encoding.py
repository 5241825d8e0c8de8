"""Legacy encodings: Japanese Shift-JIS read right, uncertain guesses flagged in the report."""

from __future__ import annotations

import ingest
from ingest.text import decode_text
from ingest_fixtures import report_for

# Natsume Soseki, 'I Am a Cat' (1905, public domain), and the Python tutorial's Japanese introduction.
JAPANESE = "\n\n".join([
    "どこで生れたかとんと見当がつかぬ。何でも薄暗いじめじめした所でニャーニャー泣いていた事だけは記憶している。"
    "吾輩はここで始めて人間というものを見た。しかもあとで聞くとそれは書生という人間中で一番獰悪な種族であったそうだ。"
    "この書生というのは時々我々を捕えて煮て食うという話である。しかしその当時は何という考もなかったから別段恐しいとも"
    "思わなかった。ただ彼の掌に載せられてスーと持ち上げられた時何だかフワフワした感じがあったばかりである。",
    "Python インタプリタや豊富な標準ライブラリは、ソースコードやバイナリ形式で Python の Web サイト "
    "https://www.python.org/ から、主要なプラットフォームについて自由に入手でき、配布することもできます。",
    "このチュートリアルは、Python 言語とシステムの基本的な概念と機能について、形式ばらずに紹介します。"
    "Python インタプリタを手元に置いて実際に使ってみると理解の助けになるでしょう。",
    "掌の上で少し落ちついて書生の顔を見たのがいわゆる人間というものの見始であろう。この時妙なものだと思った感じが"
    "今でも残っている。",
]) + "\n"

CHINESE = ("Python 是一种易于学习又功能强大的编程语言。它提供了高效的高级数据结构，还能简单有效地面向对象编程。"
           "Python 优雅的语法和动态类型以及解释型语言的本质，使它成为多数平台上写脚本和快速开发应用的理想语言。\n"
           "Python 解释器及丰富的标准库，提供了适用于各个主要系统平台的源码或机器码，这些可以到 Python 官网免费获取，"
           "并可自由地分发。\n")


def test_shift_jis_japanese_is_decoded_as_japanese(tmp_path):
    # charset-normalizer alone reads these bytes as gb18030 (Chinese-looking nonsense)
    (tmp_path / "neko.txt").write_bytes(JAPANESE.encode("shift_jis"))
    (tmp_path / "euc.txt").write_bytes(JAPANESE.replace("Python", "パイソン").encode("euc_jp"))
    corpus = ingest.ingest([tmp_path / "neko.txt", tmp_path / "euc.txt"])
    sjis = report_for(corpus, "neko.txt")
    assert (sjis.status, sjis.reason) == ("ingested", "not UTF-8; decoded as cp932 (detected)")
    euc = report_for(corpus, "euc.txt")
    assert (euc.status, euc.reason) == ("ingested", "not UTF-8; decoded as euc_jp (detected)")
    assert JAPANESE in corpus.text and "吾輩はここで始めて人間というものを見た" in corpus.text


def test_uncertain_guesses_are_reported_as_partial_with_the_alternatives(tmp_path):
    # one short Chinese sentence: Korean, Chinese and Japanese code pages all read it cleanly
    (tmp_path / "short.txt").write_bytes("这是一个简短的中文句子。\n".encode("gb18030"))
    # Russian in KOI8-R: the detector's best reading is Shift-JIS without a single kana
    (tmp_path / "koi8.txt").write_bytes("Привет, как дела? Съешь же ещё этих мягких французских булок.\n"
                                        .encode("koi8_r"))
    corpus = ingest.ingest([tmp_path / "short.txt", tmp_path / "koi8.txt"])
    short = report_for(corpus, "short.txt")
    assert short.status == "partial"
    assert short.reason.startswith("not UTF-8; encoding guessed as ") and "(uncertain: could also be " in short.reason
    koi8 = report_for(corpus, "koi8.txt")
    assert koi8.status == "partial" and "(uncertain: this Japanese reading has few kana)" in koi8.reason


def test_clear_cjk_and_cyrillic_texts_stay_confident():
    cases = [(CHINESE, "gb18030", "gb18030"),
             ("파이썬은 배우기 쉽고, 강력한 프로그래밍 언어입니다. 효율적인 고수준 데이터 구조와 간단하지만 효과적인 "
              "객체 지향 프로그래밍 접근법을 갖추고 있습니다.\n", "cp949", "cp949"),
             ("Привет, как дела? Это тестовый файл в кодировке windows-1251.\n" * 3, "cp1251", "cp1251")]
    for text, encoding, detected in cases:
        decoded = decode_text(text.encode(encoding), max_line_chars=0)
        assert (decoded.encoding, decoded.text, decoded.uncertain) == (detected, text, False)
        assert decoded.notes == [f"not UTF-8; decoded as {detected} (detected)"]
