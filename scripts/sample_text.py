"""The English text the sample traces are made of: prompts, reasoning, answers and tool calls.

Each single-turn item is ``(user, reasoning or None, answer, correct or None)``; ``correct`` is the planted
value of the ``correct`` reward component (None: no verifiable answer). Tool items hold the call and
the tool's output.
"""

from __future__ import annotations

SYSTEM = "You are DeepSeek-V4, a helpful assistant. Answer concisely and show your work when it helps."

MATH = [
    ("What is 17 * 24?", "17 * 24 = 17 * 20 + 17 * 4 = 340 + 68 = 408.", "17 × 24 = 408.", True),
    ("Solve for x: 3x + 7 = 25.", "Subtract 7: 3x = 18. Divide by 3: x = 6.", "x = 6.", True),
    (
        "A train travels 180 km in 2.5 hours. What is its average speed?",
        "Speed is distance over time: 180 / 2.5 = 72.",
        "Its average speed is 72 km/h.",
        True,
    ),
    (
        "What is the sum of the interior angles of a hexagon?",
        "For an n-gon the sum is (n - 2) * 180. With n = 6 that is 4 * 180 = 720.",
        "The interior angles of a hexagon add up to 720 degrees.",
        True,
    ),
    ("What is 15% of 240?", "10% of 240 is 24 and 5% is 12, so 15% is 36.", "15% of 240 is 36.", True),
    (
        "Simplify (x^2 - 9) / (x - 3).",
        "x^2 - 9 = (x - 3)(x + 3), so the fraction is x + 3 when x ≠ 3.",
        "(x^2 - 9) / (x - 3) = x + 3, for x ≠ 3.",
        True,
    ),
    (
        "What is the derivative of x^3 * sin(x)?",
        "Product rule: 3x^2 * sin(x) + x^3 * cos(x).",
        "d/dx [x^3 sin(x)] = 3x^2 sin(x) + x^3 cos(x).",
        True,
    ),
]

CODE = [
    (
        "Write a Python function that reverses a string.",
        None,
        "```python\ndef reverse(s: str) -> str:\n    return s[::-1]\n```\n"
        "Slicing with a step of -1 walks the string "
        "backwards.",
        None,
    ),
    (
        "How do I read a file line by line in Python?",
        None,
        "Iterate over the file object:\n```python\n"
        'with open("data.txt", encoding="utf-8") as f:\n    for line in f:'
        '\n        print(line.rstrip("\\n"))\n```\nThe file is read lazily, one line at a time.',
        None,
    ),
    (
        "What does `git rebase -i HEAD~3` do?",
        None,
        "It opens an interactive rebase of the last three commits, so you can reorder, squash, edit "
        "or drop them "
        "before they are replayed onto HEAD~3.",
        None,
    ),
    (
        "Write a SQL query that counts orders per customer.",
        None,
        "```sql\nSELECT customer_id, COUNT(*) AS orders\nFROM orders\nGROUP BY customer_id\nORDER BY orders DESC;\n```",
        None,
    ),
    (
        "Why does `for i in range(len(xs)): xs.remove(xs[i])` fail?",
        "Removing items shifts the later ones left while i keeps growing, so the index runs past the end.",
        "The list shrinks while the loop index grows, so `xs[i]` soon raises IndexError "
        "and every other item is "
        "skipped. Use `xs.clear()` or build a new list instead.",
        None,
    ),
]

TRIVIA = [
    ("What is the capital of Australia?", None, "The capital of Australia is Canberra.", True),
    (
        "Who painted the Mona Lisa?",
        None,
        "Leonardo da Vinci painted the Mona Lisa, around 1503 to 1519.",
        True,
    ),
    ("How many bones are in the adult human body?", None, "An adult human skeleton has 206 bones.", True),
    (
        "What is the chemical symbol for gold?",
        None,
        "Gold's chemical symbol is Au, from the Latin aurum.",
        True,
    ),
    ("When did the Berlin Wall fall?", None, "The Berlin Wall fell on 9 November 1989.", True),
    ("What is the speed of light in a vacuum?", None, "Exactly 299,792,458 metres per second.", True),
    (
        "Translate 'good morning' into French and Japanese.",
        None,
        "French: « Bonjour ». Japanese: おはようございます (ohayō gozaimasu).",
        True,
    ),
    ("What is the boiling point of water at sea level in Fahrenheit?", None, "It boils at 212 °F.", True),
]

# GRPO groups: one prompt, four sampled answers (reasoning, answer, correct).
GROUPS = [
    (
        "What is 23 * 47?",
        [
            ("23 * 47 = 23 * 40 + 23 * 7 = 920 + 161 = 1081.", "23 × 47 = 1081.", True),
            ("47 * 23 = 47 * 20 + 47 * 3 = 940 + 141 = 1081.", "The product is 1081.", True),
            ("23 * 47 = 23 * 50 - 23 * 3 = 1150 - 69 = 1071.", "23 × 47 = 1071.", False),
            ("20 * 47 = 940 and 3 * 47 = 131, so 1071.", "23 × 47 = 1071.", False),
        ],
    ),
    (
        "How many ways can 5 different books be arranged on a shelf?",
        [
            ("Arrangements of 5 distinct items: 5! = 120.", "There are 120 arrangements.", True),
            ("Each book has 5 places, so 5 * 5 = 25.", "There are 25 ways.", False),
            ("5 * 4 * 3 * 2 * 1 = 120.", "5! = 120 ways.", True),
            ("Choose positions: 5 * 4 * 3 = 60.", "60 ways.", False),
        ],
    ),
    (
        "Is 221 a prime number?",
        [
            ("Try small primes: 221 / 13 = 17, so 221 = 13 * 17.", "No. 221 = 13 × 17.", True),
            ("221 is odd and not divisible by 3, 5, 7 or 11.", "Yes, 221 is prime.", False),
            ("sqrt(221) < 15. 221 / 13 = 17 exactly.", "No, 221 is 13 times 17.", True),
            ("Digits sum to 5, so not divisible by 3; 13 * 17 = 221.", "221 is not prime: 13 × 17.", True),
        ],
    ),
    (
        "What is the remainder when 2^10 is divided by 7?",
        [
            ("2^3 = 8 ≡ 1 mod 7, so 2^9 ≡ 1 and 2^10 ≡ 2.", "The remainder is 2.", True),
            ("2^10 = 1024 and 1024 = 7 * 146 + 2.", "1024 mod 7 = 2.", True),
            ("1024 / 7 is about 146, and 146 * 7 = 1022, remainder 2.", "Remainder 2.", True),
            ("2^10 = 1024, 7 * 145 = 1015, remainder 9.", "The remainder is 9.", False),
        ],
    ),
]

# Tool-using single turns: user, reasoning, tool name, arguments JSON as the model wrote it, tool output,
# final reasoning, final answer.
TOOLS = [
    (
        "What's the weather in Paris right now?",
        "I need live data; call the weather tool.",
        "get_weather",
        '{"city": "Paris", "unit": "celsius"}',
        '{"city": "Paris", "temp_c": 11, "conditions": "light rain"}',
        "The tool says 11 °C with light rain.",
        "It is 11 °C in Paris with light rain. Take an umbrella.",
    ),
    (
        "Search the web for the latest stable Python release.",
        "Use the search tool.",
        "search_web",
        '{"query": "latest stable Python release"}',
        '{"results": [{"title": "Python 3.14.0 released", "url": "https://www.python.org/downloads/"}]}',
        "The first result names 3.14.0.",
        "The latest stable release is Python 3.14.0 (see python.org/downloads).",
    ),
    (
        "What is 12.5% of 3,480? Use the calculator.",
        "Call the calculator.",
        "calculator",
        '{"expression": "0.125 * 3480"}',
        '{"result": 435}',
        "0.125 * 3480 = 435.",
        "12.5% of 3,480 is 435.",
    ),
]

TOOL_SCHEMAS = {
    "get_weather": {"city": "string", "unit": "string"},
    "search_web": {"query": "string"},
    "calculator": {"expression": "string"},
    "get_stock_price": {"ticker": "string"},
}

# Multi-turn sessions: a list of (user, reasoning or None, answer) turns.
SESSION_CLEAN_TRIVIA = [
    ("Who wrote Pride and Prejudice?", None, "Jane Austen wrote it; it was published in 1813."),
    ("When was she born?", None, "She was born on 16 December 1775 in Steventon, Hampshire."),
    ("Name two of her other novels.", None, "Sense and Sensibility and Emma."),
]
SESSION_CLEAN_CODE = [
    ("Write a Python one-liner that squares the numbers 1 to 5.", None, "`[n * n for n in range(1, 6)]`"),
    ("Now keep only the even squares.", None, "`[n * n for n in range(1, 6) if n % 2 == 0]` gives [4, 16]."),
    ("And sum them?", None, "`sum(n * n for n in range(1, 6) if n % 2 == 0)` returns 20."),
]
SESSION_THINKING = [
    (
        "A rectangle has a perimeter of 30 cm and a width of 5 cm. What is its length?",
        "Perimeter = 2(l + w), so 30 = 2(l + 5), l + 5 = 15, l = 10.",
        "The length is 10 cm.",
    ),
    ("What is its area?", "Area = l * w = 10 * 5 = 50.", "The area is 50 cm²."),
    ("And its diagonal?", "sqrt(10^2 + 5^2) = sqrt(125) ≈ 11.18.", "The diagonal is √125 ≈ 11.18 cm."),
]
SESSION_TRAILING = [
    ("Give me a synonym for 'happy'.", None, "Joyful.\n\n"),
    ("And an antonym?", None, "Sad."),
    ("Use both in one sentence.", None, "She felt joyful at noon but sad by midnight."),
]
SESSION_AGENT = (
    "Compare the weather in Paris and London today.",
    [
        (
            "First Paris.",
            "get_weather",
            '{"city": "Paris"}',
            '{"city": "Paris", "temp_c": 11, "conditions": "rain"}',
        ),
        (
            "Now London.",
            "get_weather",
            '{"city": "London"}',
            '{"city": "London", "temp_c": 9, "conditions": "fog"}',
        ),
    ],
    "Paris is 11 °C and 2 degrees warmer.",
    "Paris: 11 °C with rain. London: 9 °C with fog. Paris is 2 °C warmer.",
)
