"""Chat-style training prompts written for specsure: everyday requests built from templates and topics.

The package corpus (corpus.py) makes code and documentation prompts; a head trained only on the
target's answers to those learns code and API prose, and drafts poorly in conversation. These
prompts ask for explanations, advice, lists, short stories, letters and comparisons on general
topics, so the target answers in its chat register. There are many request forms (questions,
advice on a situation, writing tasks, quizzes, rewrites) over a few hundred topics: a head trained
on a handful of forms learns the forms and drafts poorly on a user's own wording. The team wrote
every template and topic (Apache-2.0, this repository); none comes from a dataset or a
benchmark. ``--corpus chat`` selects them beside package names.
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
    "Why do so many people find {topic} interesting?",
    "How does {topic} work? Keep it short.",
    "What is {topic}?",
    "Can you tell me something interesting about {topic}?",
    "I have to give a five-minute talk on {topic} tomorrow. Can you outline it for me?",
    "Write a short text message to a friend suggesting we try {topic} this weekend.",
    "Suggest three catchy titles for a blog post about {topic}.",
    "What questions should I ask an expert in {topic}?",
    "Is {topic} a good hobby for someone who works long hours? Why or why not?",
    "Write a limerick about {topic}.",
    "What are the first three things to check if something goes wrong with {topic}?",
    "How would you explain {topic} to your grandmother?",
    "Give me a quick quiz with three questions about {topic}, and put the answers at the end.",
    "What is the difference between {topic} and {other}?",
    "Write a two-sentence horror story about {topic}.",
    "My teenager wants to get into {topic}. How can I support them?",
    "What are some good habits related to {topic}?",
    "Write a thank-you note to someone who taught me about {topic}.",
    "Describe a typical day for someone whose job involves {topic}.",
    "What are the risks of {topic}, and how can they be reduced?",
    "Give me a fun fact about {topic} that I can share at dinner.",
    "Write a short encouraging message for someone struggling with {topic}.",
    "In simple terms, why does {topic} matter?",
    "Make a short checklist for {topic}.",
    "How much time per week would I need to get good at {topic}?",
    "What is the best advice you can give about {topic} in one sentence?",
    "Write an opening paragraph for a newspaper article about {topic}.",
    "I keep putting off {topic}. How can I stop procrastinating?",
    "Brainstorm five creative ideas that combine {topic} and {other}.",
    "What would a world without {topic} look like?",
    "Explain {topic} using an analogy from everyday life.",
    "Which myths about {topic} should I stop believing?",
    "Write a short review of an imaginary book about {topic}.",
    "What do experts disagree about when it comes to {topic}?",
    "Can you recommend a simple first project related to {topic}?",
    "Rewrite this sentence so it sounds more formal: \"{topic} is really cool and everyone should try it.\"",
    "Is it true that {topic} is only for experts?",
    "Write a haiku about {topic}.",
    "How do I talk to my boss about {topic}?",
    "What are the pros and cons of {topic} compared with {other}?",
    "Give me an example of {topic} in real life.",
    "Tell me a joke about {topic}.",
    "Explain the basics of {topic} in five bullet points.",
    "How can a family on a small budget enjoy {topic}?",
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
    # added for breadth: everyday life, work, science, places, skills
    "buying a used car", "planning a wedding", "moving to a new city", "making friends as an adult",
    "raising chickens", "fixing a leaking tap", "painting a room", "writing a novel", "learning to draw",
    "keeping a journal", "training a puppy", "caring for a cat", "growing tomatoes", "making pizza at home",
    "vegetarian cooking", "food allergies", "drinking enough water", "stretching", "strength training",
    "back pain", "the common cold", "allergies in spring", "screen time for children", "homework",
    "studying for exams", "choosing a university", "student loans", "starting a small business",
    "working from home", "team meetings", "giving feedback", "asking for a promotion", "changing careers",
    "retirement savings", "paying off debt", "making a monthly budget", "insurance", "buying a house",
    "smartphones", "password managers", "backing up files", "learning to code", "spreadsheets",
    "artificial intelligence", "robots", "the internet", "email etiquette", "social media",
    "video games", "3D printing", "the history of computers", "satellites", "the International Space Station",
    "Mars", "comets", "the Big Bang", "gravity", "magnets", "electricity", "rainbows", "thunderstorms",
    "hurricanes", "the seasons", "deserts", "coral reefs", "the ocean floor", "whales", "octopuses",
    "wolves", "elephants", "butterflies", "ants", "penguins", "migrating birds", "mushrooms", "trees in autumn",
    "the Amazon river", "the Himalayas", "Japan", "Iceland", "Italian food", "Mexican cuisine", "the Silk Road",
    "the Vikings", "ancient Greece", "the Industrial Revolution", "the invention of the telephone",
    "the history of money", "castles", "pyramids", "the Great Wall of China", "maps and navigation",
    "learning to cook", "meal planning", "leftovers", "kitchen knives", "chocolate", "cheese making",
    "sourdough", "spices", "breakfast cereals", "picnics", "birthday parties", "hosting a dinner party",
    "writing a thank-you letter", "apologizing", "active listening", "conflict at work", "shyness",
    "stress", "motivation", "setting goals", "New Year's resolutions", "minimalism", "decluttering",
    "second-hand shopping", "fast fashion", "repairing clothes", "sewing", "woodworking", "pottery",
    "calligraphy", "learning the piano", "singing in a choir", "classical music", "film photography",
    "watching movies", "reading more books", "poetry", "museums", "theatre", "street art", "dancing",
    "football", "tennis", "basketball", "swimming in the sea", "skiing", "rock climbing", "sailing",
    "fishing", "walking in nature", "city parks", "public transport", "traffic jams", "train travel",
    "packing for a trip", "jet lag", "learning about other cultures", "festivals", "recycling paper",
    "electric bikes", "bees in cities", "rain gardens", "clean air", "noise pollution", "light pollution",
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
