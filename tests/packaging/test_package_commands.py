"""orochi pack / inspect / run through the real binary, and the hostile-package suite.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_package_commands

Every hostile package is a crafted archive that breaks one rule of docs/PACKAGE_FORMAT.md;
`orochi inspect` must refuse it with a message naming the member and the rule, and (checked
with strace) must not create or write any file while doing so.
"""

import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import unittest
import zipfile

BINARY = os.environ.get("OROCHI_BINARY", os.path.join(os.path.dirname(__file__), "..", "..",
                                                      "build", "bin", "orochi"))
HERE = os.path.dirname(os.path.abspath(__file__))
CALCULATOR = os.path.join(HERE, "models", "calculator")


def orochi(*args, cwd=None, check=False):
    result = subprocess.run([BINARY, *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"orochi {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result


def safetensors(tensors: dict) -> bytes:
    """A float32 safetensors image: {name: (shape, [values])}."""
    header, data = {}, b""
    for name, (shape, values) in tensors.items():
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


CALCULATOR_WEIGHTS = safetensors({"linear.weight": ([2, 4], [1, 0, 0, 0, 0, 1, 0, 0]),
                                  "linear.bias": ([2], [0.0, 0.5])})


def calculator_directory(root: str) -> str:
    """The test model's sources plus its weights, in a fresh directory."""
    directory = os.path.join(root, "calculator")
    shutil.copytree(CALCULATOR, directory, ignore=shutil.ignore_patterns("__pycache__"))
    os.makedirs(os.path.join(directory, "weights"), exist_ok=True)
    with open(os.path.join(directory, "weights", "model.safetensors"), "wb") as file:
        file.write(CALCULATOR_WEIGHTS)
    return directory


class PackInspectRunTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="orochi-package-test-")
        self.directory = calculator_directory(self.root)
        self.package = os.path.join(self.root, "calculator.orochi")

    def tearDown(self):
        shutil.rmtree(self.root)

    def test_round_trip(self):
        packed = orochi("pack", self.directory, "-o", self.package, check=True)
        self.assertIn("packed calculator version 1: 3 code files, 2 weight tensors", packed.stdout)

        described = json.loads(orochi("inspect", "--json", self.package, check=True).stdout)
        self.assertEqual(described["manifest"]["name"], "calculator")
        self.assertEqual([m["name"] for m in described["members"]],
                         ["code/model.py", "code/utils/__init__.py", "code/utils/text.py",
                          "manifest.json", "resources/labels.txt", "weights/model.safetensors"])
        weights = {t["name"]: t for t in described["weights"][0]["tensors"]}
        self.assertEqual(weights["linear.weight"]["shape"], [2, 4])
        self.assertEqual(weights["linear.weight"]["dtype"], "float32")
        self.assertEqual(weights["linear.bias"]["bytes"], 8)
        text = orochi("inspect", self.package, check=True).stdout
        self.assertIn("calculator version 1", text)
        self.assertRegex(text, r"weights/model.safetensors +\d+ bytes +stored")

        ran = orochi("run", self.package, "-i", "x=[[1,2,3,4],[5,1,0,0]]",
                     "-i", 'text=[["Hello   World"], ["A  b"]]', "--copies", "2", check=True)
        response = json.loads(ran.stdout)
        outputs = {output["name"]: output for output in response["outputs"]}
        self.assertEqual(outputs["scores"]["data"], [1.0, 2.5, 5.0, 1.5])
        self.assertEqual(outputs["scores"]["shape"], [2, 2])
        self.assertEqual(outputs["label"]["data"], ["positive", "negative"])
        self.assertEqual(outputs["words"]["data"], ["hello world", "a b"])
        self.assertEqual(outputs["copy"]["datatype"], "INT64")

    def test_classes_named_by_the_outputs_labels(self):
        # scores' manifest entry names resources/labels.txt: asked for as classes, each comes
        # back as "score:index:label", through `orochi run` as through the server's codec.
        orochi("pack", self.directory, "-o", self.package, check=True)
        request = os.path.join(self.root, "request.json")
        with open(request, "w") as file:
            json.dump({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                   "data": [1, 2, 3, 4]},
                                  {"name": "text", "datatype": "BYTES", "shape": [1, 1],
                                   "data": ["x"]}],
                       "outputs": [{"name": "scores", "parameters": {"classification": 2}}]},
                      file)
        ran = orochi("run", self.package, "--request", request, check=True)
        scores = json.loads(ran.stdout)["outputs"][0]
        self.assertEqual((scores["datatype"], scores["shape"]), ("BYTES", [1, 2]))
        self.assertEqual(scores["data"], ["2.5:1:positive", "1.0:0:negative"])

    def test_inputs_from_files_and_config(self):
        orochi("pack", self.directory, "-o", self.package, check=True)
        inputs = os.path.join(self.root, "x.json")
        with open(inputs, "w") as file:
            json.dump([[0, 0, 0, 0]], file)
        ran = orochi("run", self.package, "--input", f"x=@{inputs}", "--input", 'text=[["x"]]',
                     "--config", '{"greeting": "hi"}', check=True)
        self.assertEqual(json.loads(ran.stdout)["outputs"][1]["data"], ["positive"])

    def test_packing_twice_gives_identical_bytes(self):
        orochi("pack", self.directory, "-o", self.package, check=True)
        os.utime(os.path.join(self.directory, "code", "model.py"), (1, 1))  # mtimes do not count
        again = os.path.join(self.root, "again.orochi")
        orochi("pack", self.directory, "-o", again, check=True)
        with open(self.package, "rb") as first, open(again, "rb") as second:
            self.assertEqual(first.read(), second.read())

    def test_stored_weights_are_aligned_for_mapping(self):
        orochi("pack", self.directory, "-o", self.package, check=True)
        with zipfile.ZipFile(self.package) as archive:
            info = archive.getinfo("weights/model.safetensors")
            self.assertEqual(info.compress_type, zipfile.ZIP_STORED)
        with open(self.package, "rb") as file:
            data = file.read()
        header = data.index(b"PK\x03\x04weights"[:4], data.index(b"weights/model.safetensors") - 30)
        name_length, extra_length = struct.unpack("<HH", data[header + 26:header + 30])
        self.assertEqual((header + 30 + name_length + extra_length) % 64, 0)

    def test_pack_refuses_broken_sources(self):
        with open(os.path.join(self.directory, "code", "broken.py"), "w") as file:
            file.write("def f(:\n    pass\n")
        failed = orochi("pack", self.directory, "-o", self.package)
        self.assertEqual(failed.returncode, 1)
        self.assertIn("code/broken.py does not compile: SyntaxError", failed.stderr)
        self.assertIn("line 1", failed.stderr)
        self.assertFalse(os.path.exists(self.package))
        os.remove(os.path.join(self.directory, "code", "broken.py"))

        manifest_path = os.path.join(self.directory, "manifest.json")
        with open(manifest_path) as file:
            manifest = json.load(file)
        manifest["inputs"][0]["shape"] = [0]
        with open(manifest_path, "w") as file:
            json.dump(manifest, file)
        failed = orochi("pack", self.directory, "-o", self.package)
        self.assertIn("$.inputs[0].shape[0]: expected an integer >= 1 or -1, got 0", failed.stderr)

        os.symlink("/etc/passwd", os.path.join(self.directory, "resources", "link"))
        failed = orochi("pack", self.directory, "-o", self.package)
        self.assertIn("is a symbolic link", failed.stderr)

    def test_errors_in_model_code_come_back_with_the_traceback(self):
        orochi("pack", self.directory, "-o", self.package, check=True)
        failed = orochi("run", self.package, "-i", "x=[[-2000,0,0,0]]", "-i", 'text=[["x"]]')
        self.assertEqual(failed.returncode, 1)
        self.assertIn("ValueError: a deliberately failing input", failed.stderr)
        self.assertIn("code/model.py", failed.stderr)  # the traceback names the package's file
        self.assertIn("raise ValueError", failed.stderr)  # ... and shows its source line

    def test_a_package_that_requires_numpy_loads_only_where_numpy_is_provided(self):
        directory = os.path.join(self.root, "norm")
        os.makedirs(os.path.join(directory, "code"))
        with open(os.path.join(directory, "manifest.json"), "w") as file:
            json.dump({"format_version": 1, "name": "norm", "version": 1, "entry": "norm:Norm",
                       "requires": ["numpy"],
                       "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
                       "outputs": [{"name": "norm", "datatype": "FP64", "shape": [1]}]}, file)
        with open(os.path.join(directory, "code", "norm.py"), "w") as file:
            file.write("import numpy as np\nimport orochi\n\n\nclass Norm:\n"
                       "    def __init__(self, context):\n        pass\n\n"
                       "    def predict(self, inputs):\n"
                       "        x = np.asarray(inputs['x'])  # shares the tensor's memory\n"
                       "        return {'norm': orochi.as_tensor(np.array([np.linalg.norm(x)], dtype=np.float64))}\n")
        package = os.path.join(self.root, "norm.orochi")
        orochi("pack", directory, "-o", package, check=True)
        self.assertIn("requires: numpy\n", orochi("inspect", package, check=True).stdout)

        failed = orochi("run", package, "-i", "x=[3, 4]")
        self.assertEqual(failed.returncode, 1)
        self.assertIn("the package requires the Python module 'numpy', which this server does "
                      "not provide: add the directory that holds it to python.site_packages",
                      failed.stderr)
        self.assertNotIn("norm.py", failed.stderr)  # refused before the model's code ran

        ran = orochi("run", package, "-i", "x=[3, 4]", "--site-packages",
                     "/usr/lib/python3/dist-packages", check=True)
        outputs = json.loads(ran.stdout)["outputs"]
        self.assertEqual(outputs[0]["data"], [5.0])
        self.assertEqual(outputs[0]["datatype"], "FP64")

    def test_inputs_are_checked_against_the_manifest(self):
        orochi("pack", self.directory, "-o", self.package, check=True)
        failed = orochi("run", self.package, "-i", "x=[[1,2,3]]", "-i", 'text=[["x"]]')
        self.assertIn("input 'x' has shape [1, 3], but the model expects [-1, 4]", failed.stderr)
        failed = orochi("run", self.package, "-i", "x=[[1,2,3,4]]")
        self.assertIn("input 'text' is missing", failed.stderr)
        failed = orochi("run", self.package, "-i", "y=[1]")
        self.assertIn("the model has no input named 'y'", failed.stderr)


# --- hostile packages ------------------------------------------------------------------------

MANIFEST = json.dumps({
    "format_version": 1, "name": "hostile", "version": 1, "entry": "model:Model",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}],
}).encode()
CODE = b"class Model:\n    def __init__(self, context):\n        pass\n"


def clean_members():
    return [("manifest.json", MANIFEST, zipfile.ZIP_DEFLATED), ("code/model.py", CODE,
                                                               zipfile.ZIP_DEFLATED)]


def write_zip(path, members, symlink=None):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data, method in members:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            if symlink == name:
                info.create_system = 3
                info.external_attr = (0o120777 << 16)
            archive.writestr(info, data)


def patch_name(path, old: bytes, new: bytes):
    """Rewrites a member name in place (same length), in local and central headers."""
    assert len(old) == len(new)
    with open(path, "rb") as file:
        data = file.read()
    with open(path, "wb") as file:
        file.write(data.replace(old, new))


def hostile_cases(directory):
    """(file, expected message) for each rule."""
    cases = []

    def case(name, expected, members=None, symlink=None, after=None):
        path = os.path.join(directory, name + ".orochi")
        write_zip(path, members if members is not None else clean_members(), symlink)
        if after:
            after(path)
        cases.append((name, path, expected))

    path = os.path.join(directory, "not_a_zip.orochi")
    with open(path, "wb") as file:
        file.write(b"this is not a zip archive at all" * 4)
    cases.append(("not_a_zip", path, "not a zip archive"))

    def truncate(path):
        with open(path, "rb") as file:
            data = file.read()
        with open(path, "wb") as file:
            file.write(data[: len(data) - 30])

    case("truncated", "no end-of-central-directory record", after=truncate)
    case("parent_traversal", "member '../evil.py': path traversal ('..')",
         clean_members() + [("../evil.py", b"x", zipfile.ZIP_DEFLATED)])
    case("inner_traversal", "member 'code/../../evil.py': path traversal",
         clean_members() + [("code/../../evil.py", b"x", zipfile.ZIP_DEFLATED)])
    case("absolute_path", "member '/etc/cron.d/evil': absolute path",
         clean_members() + [("/etc/cron.d/evil", b"x", zipfile.ZIP_DEFLATED)])
    case("backslash", r"member 'code\evil.py': backslash in the name",
         clean_members() + [("code\\evil.py", b"x", zipfile.ZIP_DEFLATED)])
    case("symlink", "member 'resources/link': symbolic links are not allowed",
         clean_members() + [("resources/link", b"/etc/passwd", zipfile.ZIP_STORED)],
         symlink="resources/link")
    case("duplicate", "member 'code/model.py': duplicate member name",
         clean_members() + [("code/model.pz", CODE, zipfile.ZIP_DEFLATED)],
         after=lambda p: patch_name(p, b"code/model.pz", b"code/model.py"))
    case("not_utf8", "the name is not valid UTF-8",
         clean_members() + [("resources/\u00e9.txt", b"x", zipfile.ZIP_DEFLATED)],
         after=lambda p: patch_name(p, "resources/\u00e9.txt".encode(), b"resources/\xff\xfe.txt"))
    case("too_many_members", "members, over the limit of 10000",
         clean_members() + [(f"resources/{i}", b"", zipfile.ZIP_STORED) for i in range(10001)])
    case("zip_bomb", "compression ratio", clean_members() +
         [("resources/bomb.bin", b"\0" * (64 << 20), zipfile.ZIP_DEFLATED)])
    case("outside_layout", "member 'evil.sh': outside manifest.json, code/, weights/ and resources/",
         clean_members() + [("evil.sh", b"#!/bin/sh", zipfile.ZIP_DEFLATED)])
    case("no_manifest", "no manifest.json", [("code/model.py", CODE, zipfile.ZIP_DEFLATED)])
    bad_manifest = json.loads(MANIFEST)
    bad_manifest["outputs"][0]["datatype"] = "FLOAT"
    case("manifest_schema", "manifest.json: $.outputs[0].datatype: unknown datatype 'FLOAT'",
         [("manifest.json", json.dumps(bad_manifest).encode(), zipfile.ZIP_DEFLATED),
          ("code/model.py", CODE, zipfile.ZIP_DEFLATED)])
    def with_labels(labels, text=None, name="labels.txt", where="outputs", datatype="FP32"):
        manifest = json.loads(MANIFEST)
        manifest[where][0]["labels"] = labels
        manifest[where][0]["datatype"] = datatype
        members = [("manifest.json", json.dumps(manifest).encode(), zipfile.ZIP_DEFLATED),
                   ("code/model.py", CODE, zipfile.ZIP_DEFLATED)]
        if text is not None:
            members.append((f"resources/{name}", text, zipfile.ZIP_DEFLATED))
        return members

    case("labels_missing", "manifest.json: $.outputs[0].labels: the package has no resource "
         "'labels.txt'", with_labels("labels.txt"))
    case("labels_count", "manifest.json: $.outputs[0].labels: resources/labels.txt has 2 lines, "
         "but the output has 1 classes (its last dim)", with_labels("labels.txt", b"a\nb\n"))
    case("labels_outside", "manifest.json: $.outputs[0].labels: '../manifest.json' is not a path "
         "below resources/", with_labels("../manifest.json", b"a\n"))
    case("labels_on_bytes", "manifest.json: $.outputs[0].labels: a BYTES output has no scores to "
         "label", with_labels("labels.txt", b"a\n", datatype="BYTES"))
    case("labels_on_input", "manifest.json: $.inputs[0].labels: unknown key",
         with_labels("labels.txt", b"a\n", where="inputs"))
    case("manifest_not_json", "manifest.json: $: not valid JSON",
         [("manifest.json", b"{name: 1", zipfile.ZIP_DEFLATED),
          ("code/model.py", CODE, zipfile.ZIP_DEFLATED)])
    case("missing_entry_module", "the entry module 'model' is not in the package",
         [("manifest.json", MANIFEST, zipfile.ZIP_DEFLATED),
          ("code/other.py", CODE, zipfile.ZIP_DEFLATED)])
    case("compressed_weights", "weights must be stored uncompressed",
         clean_members() + [("weights/w.safetensors", CALCULATOR_WEIGHTS, zipfile.ZIP_DEFLATED)])
    broken = bytearray(CALCULATOR_WEIGHTS)
    broken[0:8] = struct.pack("<Q", 1 << 40)
    case("weights_header_too_long", "weights/w.safetensors': malformed safetensors: the header length",
         clean_members() + [("weights/w.safetensors", bytes(broken), zipfile.ZIP_STORED)])
    case("weights_truncated_data", "weights/w.safetensors': malformed safetensors: tensor 'linear.bias' has "
         "data_offsets [32, 40] outside the data",
         clean_members() + [("weights/w.safetensors", CALCULATOR_WEIGHTS[:-8], zipfile.ZIP_STORED)])
    case("weights_not_safetensors", "weights/ holds only *.safetensors files",
         clean_members() + [("weights/w.bin", b"x", zipfile.ZIP_STORED)])

    case("corrupt_weights", "weights/w.safetensors': CRC-32 mismatch",
         clean_members() + [("weights/w.safetensors", CALCULATOR_WEIGHTS, zipfile.ZIP_STORED)],
         after=corrupt_weights_crc)
    case("encrypted", "member 'code/model.py': encrypted members are not allowed",
         after=lambda p: patch_central(p, b"code/model.py", 8, 0x1))  # flags: encrypted
    case("unsupported_method", "member 'code/model.py': compression method 12 is not supported",
         after=lambda p: patch_central(p, b"code/model.py", 10, 12))  # method 12: bzip2
    return cases


def central_header(data: bytes, name: bytes) -> int:
    at = data.index(b"PK\x01\x02" + b"")
    while True:
        length = struct.unpack("<H", data[at + 28:at + 30])[0]
        if data[at + 46:at + 46 + length] == name:
            return at
        at = data.index(b"PK\x01\x02", at + 4)


def patch_central(path, name, offset, value):
    """Sets the 16-bit field at `offset` of `name`'s central directory header."""
    with open(path, "rb") as file:
        data = bytearray(file.read())
    at = central_header(bytes(data), name)
    data[at + offset:at + offset + 2] = struct.pack("<H", value)
    with open(path, "wb") as file:
        file.write(bytes(data))


def corrupt_weights_crc(path):
    with open(path, "rb") as file:
        data = bytearray(file.read())
    at = data.index(b"weights/w.safetensors") + len("weights/w.safetensors") + 100
    data[at] ^= 0xFF
    with open(path, "wb") as file:
        file.write(bytes(data))


def _writes(strace_line: str) -> bool:
    """Whether a traced system call creates, changes or removes a file."""
    match = re.match(r"\d+\s+(\w+)\((.*)", strace_line)
    if not match:
        return False
    call, arguments = match.groups()
    if call in ("open", "openat"):
        return re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC", arguments) is not None and \
            '"/dev/' not in arguments
    return True  # creat, mkdir, rename*, unlink*, truncate, symlink, link


class HostilePackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="orochi-hostile-")
        cls.cases = hostile_cases(cls.root)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root)

    def test_each_rule_is_enforced_with_its_message_and_nothing_is_written(self):
        strace = shutil.which("strace")
        self.assertEqual(len(self.cases), 28)
        for name, path, expected in self.cases:
            with self.subTest(name):
                workdir = tempfile.mkdtemp(dir=self.root)
                trace = os.path.join(self.root, name + ".strace")
                command = [strace, "-f", "-qq", "-e", "trace=openat,open,creat,mkdir,rename,"
                           "renameat,renameat2,unlink,unlinkat,truncate,symlink,link",
                           "-o", trace] if strace else []
                result = subprocess.run(command + [BINARY, "inspect", path], capture_output=True,
                                        text=True, cwd=workdir, timeout=120)
                self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
                self.assertIn(expected, result.stderr)
                self.assertTrue(result.stderr.startswith(f"orochi: {path}: "), result.stderr)
                self.assertEqual(os.listdir(workdir), [])
                if strace:
                    with open(trace) as log:
                        calls = log.read().splitlines()
                    writes = [call for call in calls if _writes(call)]
                    self.assertEqual(writes, [], f"{name} wrote to the file system")

    def test_a_clean_package_passes_the_same_checks(self):
        path = os.path.join(self.root, "clean.orochi")
        write_zip(path, clean_members() + [("weights/w.safetensors", CALCULATOR_WEIGHTS,
                                            zipfile.ZIP_STORED)])
        orochi("inspect", path, check=True)


if __name__ == "__main__":
    unittest.main()
