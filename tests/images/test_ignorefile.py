"""orchestrator/imaging/ignorefile.py against the cases moby/patternmatcher tests its own matcher with (patternmatcher_test.go
TestMatches, TestMatch, TestCompile; ignorefile/ignorefile_test.go TestReadAll, at 5a6d842): the port must answer as
Docker's client does, since a workspace's `.orchignore`/`.dockerignore` and `orch build`'s context follow Docker's
documented rules. A selection of each table, plus what docker-py's port gets wrong (case, escapes)."""

from __future__ import annotations

import pytest

from orchestrator.imaging import ignorefile

# (pattern, path, left out) from TestMatches, run there through MatchesOrParentMatches
MATCHES = [
    ("**", "file", True), ("**/", "file", True), ("**", "dir/file", True), ("**/**", "dir/file", True),
    ("dir/**", "dir/file", True), ("dir/**", "dir/dir2/file", True), ("**/dir", "dir", True),
    ("**/dir", "dir/file", True), ("**/dir2/*", "dir/dir2/file", True), ("**/dir2/**", "dir/dir2/dir3/file", True),
    ("**file", "file", True), ("**file", "dir/dir/file", True), ("**/file*", "dir/dir/file.txt", True),
    ("**/file*.txt*", "dir/dir/file.txt", True), ("**/**/*.txt", "dir/dir/file.txt", True),
    ("**/**/*.txt2", "dir/dir/file.txt", False), ("**/*.txt", "file.txt", True), ("a**/*.txt", "a/dir/file.txt", True),
    ("a/*.txt", "a/dir/file.txt", False), ("a/*.txt", "a/file.txt", True), ("a[b-d]e", "ae", False),
    ("a[b-d]e", "ace", True), ("a[^b-d]e", "aze", True), (".*", ".foo", True), (".*", "foo", False),
    ("abc.def", "abcdef", False), ("abc?def", "abcZdef", True), ("abc?def", "abcdef", False), ("a\\\\", "a\\", True),
    ("**/foo/bar", "dir/dir2/foo/bar", True), ("abc/**", "abc", False), ("abc/**", "abc/def/ghi", True),
    ("**/.foo", ".foo", True), ("**/.foo", "bar.foo", False), ("a(b)c/def", "a(b)c/def", True),
    ("a.|)$(}+{bc", "a.|)$(}+{bc", True), ("dist/*.whl", "dist/proxy.py-2.4.0rc3.dev36+g08acad9-py3-none-any.whl", True),
    ("a\\*b", "a*b", True),
]  # fmt: skip

MULTI = [
    (["**", "!util/docker/web"], "util/docker/web/foo", False),
    (["**", "!util/docker/web", "util/docker/web/foo"], "util/docker/web/foo", True),
    (["**", "!dist/*.whl"], "dist/proxy.py-2.4.0rc3.dev36+g08acad9-py3-none-any.whl", False),
    (["!fileutils.go", "*.go"], "fileutils.go", True),  # TestExclusionPatternMatchesPatternBefore
    (["docs", "!docs/README.md"], "docs/README.md", False),  # TestPatternMatchesFolderExclusions
    (["docs/", "!docs/README.md"], "docs/README.md", False),  # ...WithSlashExclusions
    (["docs/*", "!docs/README.md"], "docs/README.md", False),  # ...WildcardExclusions
    (["*.go", "!fileutils.go"], "fileutils.go", False),  # TestExclusionPatternMatchesPatternAfter
]

# (pattern, path, left out) from TestMatch (Go's own filepath.Match cases), and the patterns it refuses
GLOB = [
    ("a*", "ab/c", True), ("a*/b", "a/c/b", False), ("a*b*c*d*e*/f", "axbxcxdxe/xxx/f", False),
    ("a*b?c*x", "abxbbxdbxebxczzx", True), ("ab[^c]", "abc", False), ("ab[^e-g]", "abc", True),
    ("a\\*b", "ab", False), ("a?b", "a☺b", True), ("a???b", "a☺b", False), ("[a-ζ]*", "α", True),
    ("a?b", "a/b", False), ("[\\]a]", "]", True), ("[x\\-]", "-", True), ("[\\-x]", "a", False), ("*x", "xxx", True),
]  # fmt: skip
REFUSED = ["[]a]", "[-]", "[x-]", "[-x]", "\\", "[a-b-c]", "[", "[^", "[^bc", "a[", "!"]

KINDS = [("*", "regexp"), ("**", "suffix"), ("**/**", "regexp"), ("dir/**", "prefix"), ("**/dir", "suffix"),
         ("**file", "suffix"), ("abc.def", "exact"), ("a(b)c/def", "exact"), ("**/foo/bar", "suffix")]  # fmt: skip


@pytest.mark.parametrize(("pattern", "path", "left_out"), MATCHES + GLOB)
def test_one_pattern_matches_as_dockers_matcher_does(pattern, path, left_out):
    assert ignorefile.Matcher([pattern]).matches(path) is left_out


@pytest.mark.parametrize(("patterns", "path", "left_out"), MULTI)
def test_the_last_matching_pattern_decides(patterns, path, left_out):
    assert ignorefile.Matcher(patterns).matches(path) is left_out


@pytest.mark.parametrize("pattern", REFUSED)
def test_patterns_go_refuses_are_refused(pattern):
    with pytest.raises(ignorefile.BadPattern):
        ignorefile.Matcher([pattern])


@pytest.mark.parametrize(("pattern", "kind"), KINDS)
def test_patterns_compile_to_the_same_shortcut_kinds(pattern, kind):
    assert ignorefile.compile_pattern(pattern).kind == kind


def test_an_ignore_file_reads_as_dockers_client_reads_it(tmp_path):
    """TestReadAll's file, plus a BOM, a comment that does not start in column 1, and trailing slashes."""
    path = tmp_path / ".dockerignore"
    path.write_text("\ufefftest1\n/test2\n/a/file/here\n\nlastfile\n# this is a comment\n! /inverted/abs/path\n"
                    "!\n! \n #not-a-comment\ndir/\n./x/../y\n")  # fmt: skip
    assert ignorefile.read(path) == ["test1", "test2", "a/file/here", "lastfile", "!inverted/abs/path", "!", "!",
                                     "#not-a-comment", "dir", "y"]  # fmt: skip
    with pytest.raises(ignorefile.BadPattern, match=r"\.dockerignore:8: illegal exclusion"):
        ignorefile.load(path)


def test_what_docker_py_got_wrong_case_and_its_forced_files():
    """docker-py's port lowercases path and pattern, and always keeps Dockerfile and .dockerignore."""
    matcher = ignorefile.Matcher(["data", "Dockerfile", ".dockerignore"])
    assert not matcher.matches("Data/x")
    assert matcher.matches("data/x") and matcher.matches("Dockerfile") and matcher.matches(".dockerignore")


def test_a_left_out_folder_is_walked_only_when_an_exception_may_bring_something_back():
    assert not ignorefile.Matcher(["data"]).may_bring_back_below("data")
    assert not ignorefile.Matcher(["data", "!src/keep"]).may_bring_back_below("data")
    assert ignorefile.Matcher(["data", "!data/keep"]).may_bring_back_below("data")
    assert ignorefile.Matcher(["*", "!d*/keep"]).may_bring_back_below("data")
    assert ignorefile.Matcher(["*", "!**/keep"]).may_bring_back_below("data/deep")
