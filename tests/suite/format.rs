//! `codecage run --format CHANNEL`: the result as messages for a chat channel (issue 28).

use base64::Engine as _;

use super::common::*;

fn utf16_len(s: &str) -> usize {
    s.chars().map(char::len_utf16).sum()
}

#[test]
fn format_telegram_cuts_within_the_limit_and_attaches_the_whole_output() {
    as_root(|| {
        // 300 lines of HTML-looking output: more than one Telegram message holds.
        let script =
            "for i in $(seq 1 300); do echo \"$i <b>&amp;</b> row\"; done; echo oops >&2; exit 3";
        let run = bash(&["--format", "telegram", "--format-lang", "bash"], script);
        assert_eq!(run.status, 3, "{}", run.json);
        let formatted = &run.json["formatted"];
        assert_eq!(formatted["channel"], "telegram", "{}", run.json);
        assert_eq!(formatted["truncated"], true);
        let messages = formatted["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 1);
        let message = messages[0].as_str().unwrap();
        assert!(utf16_len(message) <= 4096, "{} units", utf16_len(message));
        assert!(
            message.starts_with(
                "<pre><code class=\"language-bash\">1 &lt;b&gt;&amp;amp;&lt;/b&gt; row\n"
            ),
            "{message}"
        );
        assert!(
            message.contains("more lines, full output attached as output.txt"),
            "{message}"
        );
        assert!(
            message.contains("<b>stderr:</b>\n<pre>oops\n</pre>"),
            "{message}"
        );
        assert!(message.contains("Exit status 3."), "{message}");
        let output = formatted["attachments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == "output.txt")
            .unwrap_or_else(|| panic!("no output.txt in {formatted}"));
        let data = base64::engine::general_purpose::STANDARD
            .decode(output["data"].as_str().unwrap())
            .unwrap();
        assert_eq!(data, run.stdout().as_bytes());
        assert_eq!(output["size"], data.len());
    });
}

#[test]
fn format_without_json_prints_the_messages_and_writes_the_attachments_under_out_dir() {
    as_root(|| {
        let dir = TempDir::new("format");
        let output = codecage_run()
            .args(["--format", "discord", "--format-messages", "2", "--out-dir"])
            .arg(dir.path())
            .args(["--", "bash", "-c", "seq 1 2000; echo '```'"])
            .launch_output();
        assert_eq!(output.status.code(), Some(0));
        let stdout = String::from_utf8(output.stdout).unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stdout.starts_with("----- message 1 of 2 (discord, "),
            "{stdout}"
        );
        assert!(
            stdout.contains("----- message 2 of 2 (discord, "),
            "{stdout}"
        );
        assert!(
            stdout.contains("more lines, full output attached as output.txt"),
            "{stdout}"
        );
        let expected: String = (1..=2000).map(|i| format!("{i}\n")).collect::<String>() + "```\n";
        let saved = std::fs::read_to_string(dir.path().join("output.txt")).unwrap();
        assert_eq!(saved, expected, "{stderr}");
        assert!(stderr.contains("codecage: wrote attachment"), "{stderr}");
        // An unknown channel is refused before anything runs, naming the allowed ones.
        let refused = codecage_run()
            .args(["--format", "teams", "--", "true"])
            .launch_output();
        assert_ne!(refused.status.code(), Some(0));
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(
            said.contains("discord, telegram, slack, whatsapp, markdown, plain"),
            "{said}"
        );
    });
}
