//! Shared fixtures: one redactor per process, realistic secret-bearing lines, pseudo-random
//! text.

use std::sync::OnceLock;

use airlock_redact::Redactor;

/// The built-in redactor, built once.
pub fn builtin() -> &'static Redactor {
    static REDACTOR: OnceLock<Redactor> = OnceLock::new();
    REDACTOR.get_or_init(|| Redactor::builtin().unwrap())
}

/// A line of program output with one fake secret in it.
pub struct Case {
    /// The rule that must name the replacement.
    pub id: &'static str,
    /// The line as the job prints it.
    pub input: &'static str,
    /// The line as the agent must see it.
    pub expected: &'static str,
    /// The secret itself (or its random part): no 12-byte window of it may survive.
    pub secret: &'static str,
}

/// One case per secret kind the issue names, in realistic output.
pub const CASES: &[Case] = &[
    Case {
        id: "aws-access-key-id",
        input: "Using credentials AKIA454ML6LG4TJFCZ4K for us-east-1",
        expected: "Using credentials [REDACTED:aws-access-key-id] for us-east-1",
        secret: "AKIA454ML6LG4TJFCZ4K",
    },
    Case {
        id: "aws-access-key-id",
        input: "export AWS_ACCESS_KEY_ID=ASIAAEDCMPB5U4MOS7AF",
        expected: "export AWS_ACCESS_KEY_ID=[REDACTED:aws-access-key-id]",
        secret: "ASIAAEDCMPB5U4MOS7AF",
    },
    Case {
        id: "aws-secret-access-key",
        input: "aws_secret_access_key = 6J0kGODKdinZnLXicaBAg8WY1jzIRlNQb0prFmbh",
        expected: "aws_secret_access_key = [REDACTED:aws-secret-access-key]",
        secret: "6J0kGODKdinZnLXicaBAg8WY1jzIRlNQb0prFmbh",
    },
    Case {
        id: "aws-secret-access-key",
        input: "{'SecretAccessKey': 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY', 'Expiration': '2030'}",
        expected: "{'SecretAccessKey': '[REDACTED:aws-secret-access-key]', 'Expiration': '2030'}",
        secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    },
    Case {
        id: "private-key",
        input: "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAJ9BvVvLsPHXvabshwfXd8bxP6YN5igcX3jeP2GLGpI/A7s3aEcu6t7E\nYyjDzBIjnp5xICEA+N8BNcY39fsq3ypKUPYyiuCtoDQu8PewMvf35GJMBVxqKu8l\nTi3MFKA=\n-----END RSA PRIVATE KEY-----\nkey loaded",
        expected: "[REDACTED:private-key]\nkey loaded",
        secret: "MIIEpAIBAJ9BvVvLsPHXvabshwfXd8bxP6YN5igcX3jeP2GLGpI/A7s3aEcu6t7E",
    },
    Case {
        id: "private-key",
        input: "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkZ3m7Ue8X0j5r1fJtYq2wqPzV9nH4cL3aR8sD6eK1ooAoGCCqGSM49\n-----END EC PRIVATE KEY-----",
        expected: "[REDACTED:private-key]",
        secret: "MHcCAQEEIBkZ3m7Ue8X0j5r1fJtYq2wqPzV9nH4cL3aR8sD6eK1ooAoGCCqGSM49",
    },
    Case {
        id: "private-key",
        input: "$ cat id_ed25519\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\nQyNTUxOQAAACBd3vY3sWuHq0pnf3vHkGd1Gv1xP4q7K0RkTz5b9yJwYQAAAJgx2C7N\n-----END OPENSSH PRIVATE KEY-----\n$ ",
        expected: "$ cat id_ed25519\n[REDACTED:private-key]\n$ ",
        secret: "QyNTUxOQAAACBd3vY3sWuHq0pnf3vHkGd1Gv1xP4q7K0RkTz5b9yJwYQAAAJgx2C7N",
    },
    Case {
        id: "private-key",
        input: "-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: GnuPG v2\n\nlQOYBF0Uj4cBCADJ7t4HbYw3J9k6Vx2m1dQ8pLrU3sT0aZxYc5vB2nG7hK4jE9wR\n=tW3x\n-----END PGP PRIVATE KEY BLOCK-----\n",
        expected: "[REDACTED:private-key]\n",
        secret: "lQOYBF0Uj4cBCADJ7t4HbYw3J9k6Vx2m1dQ8pLrU3sT0aZxYc5vB2nG7hK4jE9wR",
    },
    Case {
        id: "private-key",
        input: "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIFHDBOBgkqhkiG9w0BBQ0wQTApBgkqhkiG9w0BBQwwHAQIq3Zm4N1xV7sCAggA\n-----END ENCRYPTED PRIVATE KEY-----",
        expected: "[REDACTED:private-key]",
        secret: "MIIFHDBOBgkqhkiG9w0BBQ0wQTApBgkqhkiG9w0BBQwwHAQIq3Zm4N1xV7sCAggA",
    },
    Case {
        id: "private-key",
        input: "  \"private_key\": \"-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7Vx1rNzYyjDz\\nBIjnp5xICEA+N8BNcY39fsq3ypKUPYyiuCtoDQu8PewMvf35GJMBVx\\n-----END PRIVATE KEY-----\\n\",",
        expected: "  \"private_key\": \"[REDACTED:private-key]\\n\",",
        secret: "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7Vx1rNzYyjDz",
    },
    Case {
        id: "azure-storage-account-key",
        input: "conn = DefaultEndpointsProtocol=https;AccountName=jobdata;AccountKey=yIDHCEaYaE/kQHSncOAYuyuuQ+LV1KU/EFUPwqiinNo59fu09gSGYYGGVPxQAq1qIuqzWLDxb8rII1GYXrgupf==;EndpointSuffix=core.windows.net",
        expected: "conn = DefaultEndpointsProtocol=https;AccountName=jobdata;AccountKey=[REDACTED:azure-storage-account-key];EndpointSuffix=core.windows.net",
        secret: "yIDHCEaYaE/kQHSncOAYuyuuQ+LV1KU/EFUPwqiinNo59fu09gSGYYGGVPxQAq1qIuqzWLDxb8rII1GYXrgupf==",
    },
    Case {
        id: "openai-api-key",
        input: "OPENAI_API_KEY=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",
        expected: "OPENAI_API_KEY=[REDACTED:openai-api-key]",
        secret: "7_wy5yq1XoY1BaIMcAxYmfsB4HbQLXjjlAFbVV6q9rXxtNDFyuzX9k1gnneGEYG1_LwiqD9jJBT3BlbkFJAciI05FhfwKVqlUr5Qrec8TNecj9iNOrjj5VfqRTk8j1d-bWWbjkloG1QX647kdNl9cDo-_GbV",
    },
    Case {
        id: "openai-api-key",
        input: "client = OpenAI(api_key=\"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\")",
        expected: "client = OpenAI(api_key=\"[REDACTED:openai-api-key]\")",
        secret: "MszvR4-EPZGz3zBXCOArr-SfiJvo58JB0W-O5PjeJfJTNcrZ6ydIEsgo5nT3BlbkFJVjzz8Gwb8ewCISuYCl0Xq56zaWR7PAmpBFXlNPHcSke4R1J_dBi2ewQr8t",
    },
    Case {
        id: "openai-api-key",
        input: "key: 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.",
        expected: "key: [REDACTED:openai-api-key].",
        secret: "H5UH1RSC84FL8SfWoCHJT3BlbkFJs1UJOkHG16JqtQy9235N",
    },
    Case {
        id: "anthropic-api-key",
        input: "x-api-key: sk-ant-api03-AMsI-z0oaWdfZp_lvi60ZIF8-qR38Ony1dHqceytDbKPTF-n-pGz3cW0uABBrDSxOOyBymrEqlHXm31qzZcmzTUoRyj9nAA",
        expected: "x-api-key: [REDACTED:anthropic-api-key]",
        secret: "AMsI-z0oaWdfZp_lvi60ZIF8-qR38Ony1dHqceytDbKPTF-n-pGz3cW0uABBrDSxOOyBymrEqlHXm31qzZcmzTUoRyj9nAA",
    },
    Case {
        id: "anthropic-admin-key",
        input: "['sk-ant-admin01-de9syxoAwuKmhr7jmPY72T3AVbfzx06UVZyvmbPkZyRHJouZrQV3xZAxjRM8mbTgDIMRBZxjX-BpYconEG4ZgzWbmHGJRAA']",
        expected: "['[REDACTED:anthropic-admin-key]']",
        secret: "de9syxoAwuKmhr7jmPY72T3AVbfzx06UVZyvmbPkZyRHJouZrQV3xZAxjRM8mbTgDIMRBZxjX-BpYconEG4ZgzWbmHGJRAA",
    },
    Case {
        id: "github-pat",
        input: "GITHUB_TOKEN ghp_JIGA9HK2gOCZPeJMQW9cy78kyEk2FINMdB8F loaded",
        expected: "GITHUB_TOKEN [REDACTED:github-pat] loaded",
        secret: "JIGA9HK2gOCZPeJMQW9cy78kyEk2FINMdB8F",
    },
    Case {
        id: "github-oauth-token",
        input: "token=gho_AsHzMtxHsEPrJ7sQTVsbaXpLcOkAWRyd5uVz",
        expected: "token=[REDACTED:github-oauth-token]",
        secret: "AsHzMtxHsEPrJ7sQTVsbaXpLcOkAWRyd5uVz",
    },
    Case {
        id: "github-user-token",
        input: "{\"token\":\"ghu_dLU8ueZ5oBUEqWpcHg7ZU6Dj90pMThdNADhn\"}",
        expected: "{\"token\":\"[REDACTED:github-user-token]\"}",
        secret: "dLU8ueZ5oBUEqWpcHg7ZU6Dj90pMThdNADhn",
    },
    Case {
        id: "github-app-token",
        input: "remote: https://x-access-token:ghs_3dwHjhxCiQADMqOLRAxXVH0i8sUipEhG5tYG@github.com/org/repo.git",
        expected: "remote: https://x-access-token:[REDACTED:github-app-token]@github.com/org/repo.git",
        secret: "3dwHjhxCiQADMqOLRAxXVH0i8sUipEhG5tYG",
    },
    Case {
        id: "github-refresh-token",
        input: "refresh ghr_N2wrrNRUKSLmOrWpm8pGP6m4RcOdarqBbNcg",
        expected: "refresh [REDACTED:github-refresh-token]",
        secret: "N2wrrNRUKSLmOrWpm8pGP6m4RcOdarqBbNcg",
    },
    Case {
        id: "github-fine-grained-pat",
        input: "GH_TOKEN=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",
        expected: "GH_TOKEN=[REDACTED:github-fine-grained-pat]",
        secret: "oIreWf6RkJpOxEEwnvvFVi_13eZhCZ0N1XXnCBVqyZjxjP1MusJWV06lBPxLgD4ufIfBKKF0RDt0Xaetn6",
    },
    Case {
        id: "gitlab-pat",
        input: "PRIVATE-TOKEN: glpat-kM-PKsCTPUpP4J4N6OCZ",
        expected: "PRIVATE-TOKEN: [REDACTED:gitlab-pat]",
        secret: "kM-PKsCTPUpP4J4N6OCZ",
    },
    Case {
        id: "slack-bot-token",
        input: "SLACK_BOT_TOKEN=xoxb-83155056963-9568299221740-oHdIkKs9bP1ZBeLItYIfvfrV",
        expected: "SLACK_BOT_TOKEN=[REDACTED:slack-bot-token]",
        secret: "83155056963-9568299221740-oHdIkKs9bP1ZBeLItYIfvfrV",
    },
    Case {
        id: "slack-user-token",
        input: "token: xoxp-15102163378-576555277819-0650617808501-dd475c5a6cd981f939451e0f1a365b67",
        expected: "token: [REDACTED:slack-user-token]",
        secret: "15102163378-576555277819-0650617808501-dd475c5a6cd981f939451e0f1a365b67",
    },
    Case {
        id: "slack-token",
        input: "xoxa-2-MTEMGoCl5rzl6W7tOJ80JE2qF4z69vQJX9fE3ozd",
        expected: "[REDACTED:slack-token]",
        secret: "MTEMGoCl5rzl6W7tOJ80JE2qF4z69vQJX9fE3ozd",
    },
    Case {
        id: "slack-token",
        input: "refresh_token=xoxr-n8iZZyHYHXrYdQ7p5a3E5xCYpTAM3kAkXujq63ZH\n",
        expected: "refresh_token=[REDACTED:slack-token]\n",
        secret: "n8iZZyHYHXrYdQ7p5a3E5xCYpTAM3kAkXujq63ZH",
    },
    Case {
        id: "slack-token",
        input: "cookie d=xoxs-29488029203-221549817719-884036317308-df59a9c29e2b243ce3e0cf793e0649c9ac2866c3a98faec23434556c1e237153;",
        expected: "cookie d=[REDACTED:slack-token];",
        secret: "df59a9c29e2b243ce3e0cf793e0649c9ac2866c3a98faec23434556c1e237153",
    },
    Case {
        id: "slack-webhook-url",
        input: "POST https://hooks.slack.com/services/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 -> 200",
        expected: "POST https://hooks.slack.com/services/[REDACTED:slack-webhook-url] -> 200",
        secret: "vmvtPCgJynGvYs0gNTkqXI5t",
    },
    Case {
        id: "stripe-secret-key",
        input: "stripe.api_key = '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'",
        expected: "stripe.api_key = '[REDACTED:stripe-secret-key]'",
        secret: "JowNGGjKTm7HTT17mK8bOQmXfipEKASvvf73xrD4hCUip5KIIJeJ6qk6V50vMjh70asR5xpWKx1klMJZeDczlY78QitWQ2V6yNL",
    },
    Case {
        id: "stripe-secret-key",
        input: "sk_test_dESgH6pItQz8p4e6U93Qx3IA",
        expected: "[REDACTED:stripe-secret-key]",
        secret: "dESgH6pItQz8p4e6U93Qx3IA",
    },
    Case {
        id: "stripe-restricted-key",
        input: "key=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",
        expected: "key=[REDACTED:stripe-restricted-key]",
        secret: "OZWbkmADcjHyhKzlvHiqpK7vdPYcUQYjz9FMgEwA5N6SKWAWsF4D152SA0BhKh58HvHHBA5bu6dsUN5BUyMuWYt4L4eph2CpG3z",
    },
    Case {
        id: "google-api-key",
        input: "https://maps.googleapis.com/maps/api/geocode/json?address=x&key=AIza5YsTDfNd6ONP-s8AzLhzOT8cwzEygnNOJ1r",
        expected: "https://maps.googleapis.com/maps/api/geocode/json?address=x&key=[REDACTED:google-api-key]",
        secret: "5YsTDfNd6ONP-s8AzLhzOT8cwzEygnNOJ1r",
    },
    Case {
        id: "jwt",
        input: "id_token: eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCIsImtpZCI6ImsxIn0.eyJzdWIiOiJzdmMtcnVubmVyIiwiaXNzIjoiaHR0cHM6Ly9hdXRoLmV4YW1wbGUuY29tIiwiZXhwIjoxNzY3MjI1NjAwLCJzY29wZSI6ImpvYnM6cnVuIn0.JriwT_97KbgMFPyZiOxnCDy9mFjTQHSmayUO-uqjCM1-VdY1Ifu7kPMhoeXJaRsrb18mD9hrSyR07P-e2iv5hQ",
        expected: "id_token: [REDACTED:jwt]",
        secret: "JriwT_97KbgMFPyZiOxnCDy9mFjTQHSmayUO-uqjCM1-VdY1Ifu7kPMhoeXJaRsrb18mD9hrSyR07P-e2iv5hQ",
    },
    Case {
        id: "connection-string-password",
        input: "engine = create_engine('postgresql+psycopg2://app:Wq9x2LmP4vR8tZ@db.internal:5432/jobs')",
        expected: "engine = create_engine('postgresql+psycopg2://app:[REDACTED:connection-string-password]@db.internal:5432/jobs')",
        secret: "Wq9x2LmP4vR8tZ",
    },
    Case {
        id: "connection-string-password",
        input: "DATABASE_URL=postgres://app:Wq9x2LmP4vR8tZ@db.internal/jobs",
        expected: "DATABASE_URL=postgres://app:[REDACTED:connection-string-password]@db.internal/jobs",
        secret: "Wq9x2LmP4vR8tZ",
    },
    Case {
        id: "connection-string-password",
        input: "mysql://root:hunter2-but-longer@127.0.0.1:3306/shop",
        expected: "mysql://root:[REDACTED:connection-string-password]@127.0.0.1:3306/shop",
        secret: "hunter2-but-longer",
    },
    Case {
        id: "connection-string-password",
        input: "MongoClient('mongodb://svc:Zm9vYmFyYmF6@mongo-0:27017/?authSource=admin')",
        expected: "MongoClient('mongodb://svc:[REDACTED:connection-string-password]@mongo-0:27017/?authSource=admin')",
        secret: "Zm9vYmFyYmF6",
    },
    Case {
        id: "connection-string-password",
        input: "mongodb+srv://svc:Zm9vYmFyYmF6cXV4@cluster0.abcde.mongodb.net/?retryWrites=true",
        expected: "mongodb+srv://svc:[REDACTED:connection-string-password]@cluster0.abcde.mongodb.net/?retryWrites=true",
        secret: "Zm9vYmFyYmF6cXV4",
    },
    Case {
        id: "connection-string-password",
        input: "redis://:p4ssw0rd-redis@cache:6379/0",
        expected: "redis://:[REDACTED:connection-string-password]@cache:6379/0",
        secret: "p4ssw0rd-redis",
    },
    Case {
        id: "connection-string-password",
        input: "rediss://default:AVNS_k3yv4lu3xyz@redis.example.com:25061",
        expected: "rediss://default:[REDACTED:connection-string-password]@redis.example.com:25061",
        secret: "AVNS_k3yv4lu3xyz",
    },
    Case {
        id: "connection-string-password",
        input: "broker_url = 'amqp://guest:rabbit-secret-1@mq:5672//'",
        expected: "broker_url = 'amqp://guest:[REDACTED:connection-string-password]@mq:5672//'",
        secret: "rabbit-secret-1",
    },
    Case {
        id: "connection-string-password",
        input: "amqps://guest:rabbit-secret-2@mq.example.com/vhost",
        expected: "amqps://guest:[REDACTED:connection-string-password]@mq.example.com/vhost",
        secret: "rabbit-secret-2",
    },
    Case {
        id: "bearer-token",
        input: "> Authorization: Bearer BGJyLF4gwdvpjITdNi7bAiUbHF-ZNm9Z0GdbsDPX\n> Accept: */*",
        expected: "> Authorization: Bearer [REDACTED:bearer-token]\n> Accept: */*",
        secret: "BGJyLF4gwdvpjITdNi7bAiUbHF-ZNm9Z0GdbsDPX",
    },
    Case {
        id: "bearer-token",
        input: "headers={'Authorization': 'Bearer BGJyLF4gwdvpjITdNi7bAiUbHF-ZNm9Z0GdbsDPX', 'Accept': 'application/json'}",
        expected: "headers={'Authorization': 'Bearer [REDACTED:bearer-token]', 'Accept': 'application/json'}",
        secret: "BGJyLF4gwdvpjITdNi7bAiUbHF-ZNm9Z0GdbsDPX",
    },
    Case {
        id: "huggingface-token",
        input: "HF_TOKEN=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",
        expected: "HF_TOKEN=[REDACTED:huggingface-token]",
        secret: "GzKPTnrgxdjUXxiXpUhbuyCfyuqXHQdtzM",
    },
    Case {
        id: "npm-token",
        input: "//registry.npmjs.org/:_authToken=npm_pFcmjGMicntABEISiHTJquUCQyj4n1rITCzi",
        expected: "//registry.npmjs.org/:_authToken=[REDACTED:npm-token]",
        secret: "pFcmjGMicntABEISiHTJquUCQyj4n1rITCzi",
    },
    Case {
        id: "sendgrid-api-key",
        input: "SENDGRID_API_KEY: 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",
        expected: "SENDGRID_API_KEY: [REDACTED:sendgrid-api-key]",
        secret: "2pY-h_XQK-JCuZz8vSElR2t9GNcYpUiZIgW-M8PGjde",
    },
    Case {
        id: "twilio-api-key",
        input: "Client('SKbab985fcab0621dd282eecc1489fbf04', secret, account_sid)",
        expected: "Client('[REDACTED:twilio-api-key]', secret, account_sid)",
        secret: "bab985fcab0621dd282eecc1489fbf04",
    },
];

/// Pseudo-random text over `alphabet` (xorshift), so fixtures are fixed across runs.
pub fn pseudo_random(len: usize, mut seed: u64, alphabet: &[u8]) -> String {
    seed = seed.max(1);
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            char::from(alphabet[(seed % alphabet.len() as u64) as usize])
        })
        .collect()
}

/// The standard base64 alphabet.
pub const BASE64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Program output with no secret in it: training logs.
pub fn noise(len: usize) -> String {
    let line = "epoch 3 step 117: loss=0.4213 acc=0.871 lr=3.0e-4 elapsed=12.5s\n";
    line.repeat(len / line.len() + 1)[..len].to_owned()
}

/// `text` in pieces of about `size` bytes, each ending on a character boundary.
pub fn chunks(text: &str, size: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let mut end = (at + size.max(1)).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(&text[at..end]);
        at = end;
    }
    out
}

/// Runs `pieces` through a stream of the built-in redactor; returns the output and count.
pub fn stream_all(pieces: &[&str]) -> (String, u64) {
    let mut s = builtin().stream();
    let mut out = String::new();
    for p in pieces {
        out += &s.push(p);
    }
    out += &s.finish();
    (out, s.count())
}
