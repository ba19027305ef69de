//! Ordinary program output must come back byte for byte.

use pretty_assertions::assert_eq;

use super::common::{BASE64, builtin, chunks, pseudo_random, stream_all};

const PNG_24X24: &str = "iVBORw0KGgoAAAANSUhEUgAAABgAAAAYCAIAAABvFaqvAAABxUlEQVR42u3UQRWlIQiGYSIYwQhGMAIRjGCENwIRiGAEIhCBCEaY++/H3SzH9XM8wMdBRGhCF4YwBRWWsAUEE1w4QggplHCFlxdptEZvjMZsaGM1doOGNbxxGtHIRjVu4+VFOq3TO6MzO9pZnd2hYx3vnE50slOd23l5kUEb9MEYzIEO1mAPGNjAB2cQgxzU4A5eXmTSJn0yJnOikzXZEyY28cmZxCQnNbmTlxdRmtKVoUxFlaVsBcUUV44SSiqlXOXlRRZt0RdjMRe6WIu9YGELX5xFLHJRi7t4eZFN2/TN2MyNbtZmb9jYxjdnE5vc1OZuXv63Fr+gfxH9hvsby6+hXym/T75n4HAgIKHgfuv1dy9iNKMbw5iGGsvY9n1jhhvHCCONMq7x8iJOc7oznOmos5ztXzHmuHOccNIp5zovL3Joh34Yh3nQwzrs87VkBz+cQxzyUId7eHmRoAU9GMEMNFjBjm8wFnhwgggyqOAGLy+StKQnI5mJJivZ+Y3XEk9OEkkmldzk5UWKVvRiFLPQYhW7vpCs8OIUUWRRxS1eXuTSLv0yLvOil3XZ94vaLn45l7jkpS738vLy/x79v0f/4B79AQhX3B9qjaP5AAAAAElFTkSuQmCC";

fn corpus() -> String {
    let traceback = r#"Traceback (most recent call last):
  File "/work/main.py", line 14, in <module>
    result = fetch(url, retries=3)
  File "/work/main.py", line 9, in fetch
    resp = requests.get(url, timeout=5, headers={"Accept": "application/json"})
  File "/usr/lib/python3/dist-packages/requests/api.py", line 73, in get
    return request("get", url, params=params, **kwargs)
requests.exceptions.ConnectionError: HTTPSConnectionPool(host='api.example.com', port=443): Max retries exceeded with url: /v1/items?page=2 (Caused by NewConnectionError('<urllib3.connection.HTTPSConnection object at 0x7f3a2c1b4d90>: Failed to establish a new connection: [Errno -3] Temporary failure in name resolution'))
KeyError: 'api_key'
TypeError: connect() got an unexpected keyword argument 'password'
"#;
    let digests = "\
sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
image: python@sha256:3e1f2b0c9d8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c
md5 d41d8cd98f00b204e9800998ecf8427e  empty.txt
sha1 da39a3ee5e6b4b0d3255bfef95601890afd80709
git commit 4b1d0c2e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c
SKIPPED 3 tests; TASK_ID=SK-1042; DISK /dev/sda1 93%
";
    let ids = "\
uuid 123e4567-e89b-12d3-a456-426614174000
job_id=01JE5Q8N3V7M2K9X4R6T1W0YZB request-id: 9b2c7e1a-55f0-4c1e-9d5e-2f7a1c3b4d6e
user_id=104583457212345678901 order=AB-2024-000123
";
    let paths_and_numbers = "\
/usr/lib/x86_64-linux-gnu/libssl.so.3 /home/runner/.cache/pip/wheels/ab/cd/ef
C:\\Users\\runner\\AppData\\Local\\Temp\\tmpk2x9.csv ./data/2024-06-01/part-00003.parquet
3.141592653589793 2.718281828459045 6.02214076e+23 -0.000012 18446744073709551615
0x7ffd5f4e3a20 0xdeadbeef 1,234,567.89 42
";
    let tools = "\
Collecting numpy==2.1.0
  Downloading numpy-2.1.0-cp312-cp312-manylinux_2_17_x86_64.whl (16.0 MB)
Successfully installed numpy-2.1.0 pandas-2.2.2
   col_a  col_b     label
0   0.12   3.40  positive
1   0.98  -1.20  negative
{\"status\": \"ok\", \"token_count\": 812, \"model\": \"gpt-4o\", \"api_version\": \"2024-06-01\"}
GET https://api.example.com/v1/items?page=2&sort=desc 200 OK (123 ms)
Cloning into 'repo'... git@github.com:org/repo.git ssh://git@gitlab.com:22/org/repo.git
mail sent to ops@example.com; see https://docs.example.com/auth#bearer-tokens
Enter password: (input hidden)
password: str = field(repr=False)
api_key = os.environ[\"OPENAI_API_KEY\"]
Using Bearer auth from the environment
ECDSA key fingerprint is SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s.
-----BEGIN CERTIFICATE-----
MIIBszCCAVmgAwIBAgIUQ3tD2sUNiVztksCsDhcc0u9e8BujQwCgYIKoZIzj0EAwIw
-----END CERTIFICATE-----
-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE3nq8X0j5r1fJtYq2wqPzV9nH4cL3
-----END PUBLIC KEY-----
";
    let image = format!("<img src=\"data:image/png;base64,{PNG_24X24}\">\n");
    let blob = format!("{}\n", pseudo_random(4096, 99, BASE64));
    let unicode = "résumé: naïve café — 東京 ✓ █████▌ 73%\n";
    [
        traceback,
        digests,
        ids,
        paths_and_numbers,
        tools,
        &image,
        &blob,
        unicode,
    ]
    .concat()
}

#[test]
fn ordinary_output_is_untouched() {
    let text = corpus();
    let out = builtin().redact(&text);
    assert_eq!(out.text, text);
    assert_eq!(out.count, 0);
}

#[test]
fn ordinary_output_is_untouched_by_the_stream_too() {
    let text = corpus().repeat(4);
    let (out, count) = stream_all(&chunks(&text, 777));
    assert_eq!(out, text);
    assert_eq!(count, 0);
}
