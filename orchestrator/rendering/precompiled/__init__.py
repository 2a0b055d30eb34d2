"""manifests/*.j2 compiled by Jinja2 3.1.6 (Environment.compile_templates), one module per template.

rendering/templates.py reads a template's module (jinja2.ModuleLoader) while the template's source has the
digest below and Jinja2 is this version, and compiles the template otherwise. Generated, never edited:
ORCH_UPDATE_GOLDENS=1 pytest tests/spec/test_precompiled.py (which fails while this folder is out of date).
"""

JINJA2_VERSION = "3.1.6"
SOURCE_DIGESTS = {
    "configmap.yaml.j2": "cc5f07c07666a560fc8f37328a72c525e133f62dc00d23b1a7456a6e903c8eb2",
    "parts.j2": "e0c438e7c0bd682e126acfeb05da478e1a40848798acd380f5cb57f59ddc442b",
    "pod.yaml.j2": "c60145be3c7a652defb50959e9e0a40891f0abfcdb3c247cf2830289be775c84",
    "podmonitor.yaml.j2": "e4c143515f2f39e31ad23c1f4a338f97e8401904e7c606a0c7ec78e69c3c53d2",
    "pytorchjob.yaml.j2": "a48130263b44e875a034125ebbb3fb71eaef9813ac349f374941a2a313343f68",
    "trainingruntime.yaml.j2": "bfa5923c3894d6ba6b645e41d950daf471576a6e3759ac18c44f3d88f3509b79",
    "trainjob.yaml.j2": "95df342ce6bb267588f3ef3c1a7df224652e31181fdef0d0e02b17093f2fbdfd",
}
