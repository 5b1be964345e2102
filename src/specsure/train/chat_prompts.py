"""Chat-style training prompts written for specsure: everyday requests built from templates and topics.

The package corpus (corpus.py) makes code and documentation prompts; a head trained only on the
target's answers to those learns code and API prose, and drafts poorly in conversation. These
prompts ask for explanations, advice, lists, short stories, letters and comparisons on general
topics, so the target answers in its chat register. The team wrote every template and topic
(Apache-2.0, this repository); none comes from a dataset or a benchmark. ``--corpus chat``
selects them beside package names.
"""

from __future__ import annotations

import random

from specsure.train.corpus import CorpusPrompt

SOURCE = "chat"
"""The name ``--corpus`` takes for these prompts."""
LICENCE = "Apache-2.0 (written for this repository)"

TEMPLATES = (
    "Explain {topic} to a ten-year-old.",
    "What are the main advantages and disadvantages of {topic}?",
    "Write a short poem about {topic}.",
    "Give me three practical tips about {topic}.",
    "I am completely new to {topic}. Where should I start?",
    "Write a friendly email inviting a colleague to a workshop on {topic}.",
    "Summarize the history of {topic} in one paragraph.",
    "What is a common misconception about {topic}, and what is the truth?",
    "Compare {topic} with {other}. Which would you recommend to a beginner?",
    "Plan a one-week schedule for someone who wants to learn about {topic}.",
    "Tell a short story in which {topic} plays an important part.",
    "List five questions a curious student might ask about {topic}, with short answers.",
    "My friend says {topic} is a waste of time. How could I answer politely?",
    "Describe {topic} in three sentences, then give one surprising fact about it.",
    "What should I know about {topic} before spending money on it?",
    "Write a product description for a beginner's guide to {topic}.",
    "How has {topic} changed over the last fifty years?",
    "Give a step-by-step explanation of how to get started with {topic}.",
    "Write a dialogue between a teacher and a student about {topic}.",
    "What are the most important words someone should learn when reading about {topic}?",
)

TOPICS = (
    "gardening", "photosynthesis", "saving money", "the French Revolution", "cooking rice", "black holes",
    "public speaking", "recycling plastic", "time management", "the water cycle", "running a marathon",
    "electric cars", "meditation", "volcanoes", "writing a resume", "the stock market", "honey bees",
    "climate change", "chess", "baking bread", "learning a second language", "the human heart",
    "solar panels", "board games", "the Roman Empire", "sleep", "bird watching", "budget travel",
    "knitting", "vaccines", "the moon landing", "composting", "job interviews", "coffee", "earthquakes",
    "renting an apartment", "playing the guitar", "the immune system", "wind energy", "first aid",
    "photography", "ancient Egypt", "healthy breakfasts", "rainforests", "credit cards", "yoga",
    "the printing press", "adopting a dog", "camping", "the periodic table", "volunteering",
    "home insulation", "tea", "the Olympic Games", "jazz music", "tides", "houseplants",
    "online privacy", "cycling to work", "the Renaissance", "fermentation", "mountain hiking",
    "saving water at home", "dinosaurs", "podcasts", "the solar system", "negotiating a salary",
    "street food", "glaciers", "origami", "libraries", "learning to swim",
)


def chat_prompts(limit: int, seed: int = 0) -> list[CorpusPrompt]:
    """Up to ``limit`` distinct prompts, a seeded sample of every template x topic pair."""
    if limit < 1:
        raise ValueError(f"limit = {limit!r}: ask for at least one prompt.")
    rng = random.Random(seed)
    pairs = [(t, topic) for t in range(len(TEMPLATES)) for topic in range(len(TOPICS))]
    rng.shuffle(pairs)
    out = []
    for t, topic in pairs[:limit]:
        other = TOPICS[(topic + 1 + rng.randrange(len(TOPICS) - 1)) % len(TOPICS)]  # never the topic itself
        text = TEMPLATES[t].format(topic=TOPICS[topic], other=other)
        out.append(CorpusPrompt(text, SOURCE, LICENCE, f"template {t}, topic {topic}"))
    return out
