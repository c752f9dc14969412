"""Chat prompts for training and evaluating the EAGLE head on a chat target.

Training prompts pair instruction templates with topics; the held-out prompts
(``HELDOUT``, also used by ``benchmarks/eagle_bench.py``) are written out by
hand on topics absent from the training lists, and none of them asks the model
to copy or edit text from the prompt.
"""

from __future__ import annotations

import random

TEMPLATES = [
    "Explain {t} in simple terms.",
    "What is {t}? Give a short answer.",
    "Write a short paragraph about {t}.",
    "Give me three interesting facts about {t}.",
    "Why is {t} important?",
    "Write a haiku about {t}.",
    "Describe {t} to a ten-year-old.",
    "What are the pros and cons of {t}?",
    "List five tips related to {t}.",
    "Write a short story that involves {t}.",
    "How does {t} work?",
    "Summarize the history of {t} in a few sentences.",
    "What are common misconceptions about {t}?",
    "Write a friendly email to a colleague about {t}.",
    "Compare {t} with something from everyday life.",
    "What should a beginner know about {t}?",
    "Give an example that illustrates {t}.",
    "Write a limerick about {t}.",
    "What questions would you ask an expert on {t}?",
    "Write a product description for something related to {t}.",
    "Tell me a fun fact about {t}.",
    "What is the future of {t}?",
    "Write a short poem about {t}.",
    "How would you teach {t} in one lesson?",
]

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "volcanoes", "the immune system", "gravity",
    "climate change", "recycling", "the moon", "honeybees", "rainforests", "the ocean tides", "dinosaurs",
    "electricity", "magnets", "the human heart", "sleep", "exercise", "healthy eating", "coffee", "tea",
    "chocolate", "bread baking", "gardening", "composting", "bicycles", "trains", "airplanes", "rockets",
    "the internet", "email", "smartphones", "video games", "chess", "football", "the Olympic Games",
    "music theory", "the piano", "jazz", "painting", "photography", "poetry", "libraries", "museums",
    "the Roman Empire", "ancient Egypt", "the printing press", "the industrial revolution", "democracy",
    "money", "saving money", "budgeting", "taxes", "inflation", "the stock market", "renewable energy",
    "solar panels", "wind turbines", "nuclear power", "electric cars", "public transport", "cities",
    "friendship", "kindness", "time management", "public speaking", "learning a language", "reading books",
    "writing essays", "job interviews", "teamwork", "leadership", "meditation", "stress", "happiness",
    "cats", "dogs", "birds", "whales", "elephants", "penguins", "butterflies", "ants", "trees", "mushrooms",
    "deserts", "mountains", "rivers", "islands", "snow", "thunderstorms", "rainbows", "earthquakes",
    "the solar system", "Mars", "stars", "telescopes", "microscopes", "DNA", "vaccines", "antibiotics",
    "the brain", "memory", "dreams", "colors", "sound", "light", "temperature", "clocks", "calendars",
    "maps", "compasses", "the alphabet", "numbers", "prime numbers", "fractions", "geometry", "statistics",
    "probability", "algorithms", "programming", "Python", "databases", "spreadsheets", "cybersecurity",
    "passwords", "artificial intelligence", "robots", "3D printing", "bridges", "skyscrapers", "castles",
    "pirates", "knights", "cooking pasta", "making soup", "camping", "hiking", "swimming", "running",
    "yoga", "birthdays", "holidays", "travel", "hotels", "airports", "postcards", "board games", "puzzles",
    "origami", "knitting", "pottery", "woodworking", "fashion", "shoes", "umbrellas", "weather forecasts",
]

# Held out: topics and wording absent from the training lists above.
HELDOUT = [
    "Write a short poem about autumn leaves.",
    "Explain how a refrigerator keeps food cold.",
    "What are some good habits for staying focused while studying?",
    "Tell me a short story about a lost kitten who finds its way home.",
    "Why do we have seasons on Earth?",
    "Give me three ideas for a rainy-day activity with kids.",
    "What is the difference between a virus and a bacterium?",
    "Describe a typical day in the life of a lighthouse keeper.",
    "How can I make my morning routine more relaxing?",
    "Explain what a tsunami is to a child.",
    "Write a thank-you note to a teacher.",
    "What are the benefits of drinking water?",
    "How do hot air balloons float?",
    "Suggest a simple recipe for a vegetable salad.",
    "What makes a good friend?",
    "Explain why the sky is blue.",
    "Write a short motivational message for someone starting a new job.",
    "What are the main parts of a plant and what do they do?",
    "How do I take care of a houseplant?",
    "Describe the planet Jupiter.",
]


# A second prompt set (``training_prompts(..., prompt_set="b")``): conversational
# wordings with every topic, and the first templates with more topics; again none
# of them a held-out topic or wording.
MORE_TEMPLATES = [
    "Can you help me understand {t}?",
    "I'm curious about {t}. Where should I start?",
    "My friend asked me about {t} and I didn't know what to say. Can you help?",
    "Give me a step-by-step guide to getting started with {t}.",
    "Why do people find {t} interesting?",
    "Suggest three weekend activities related to {t}.",
    "What does someone who works with {t} actually do?",
    "Who gains the most from {t}, and how?",
    "Write a short dialogue between two people talking about {t}.",
    "What mistakes do people often make with {t}?",
    "Write a riddle whose answer is {t}.",
    "If you could change one thing about {t}, what would it be and why?",
    "Write a short speech about {t} for a school assembly.",
    "What is the most surprising thing about {t}?",
    "Give me a quick quiz with three questions about {t}.",
    "Write a tweet about {t}.",
    "Explain {t} using an analogy.",
    "What would happen if {t} disappeared tomorrow?",
    "Write a short diary entry from someone discovering {t}.",
    "How has {t} changed over the last hundred years?",
    "What do experts disagree about when it comes to {t}?",
    "Write a short advertisement for a class about {t}.",
    "What is one small thing I can do today related to {t}?",
    "Give me a simple explanation of {t} and then a more detailed one.",
]

MORE_TOPICS = [
    "octopuses", "sharks", "dolphins", "owls", "horses", "frogs", "bats", "wolves", "coral reefs",
    "glaciers", "caves", "waterfalls", "fog", "hurricanes", "lightning", "comets", "the sun", "Saturn",
    "satellites", "space stations", "astronauts", "gravity waves", "atoms", "molecules", "chemistry",
    "physics", "biology", "evolution", "fossils", "archaeology", "ancient Greece", "the Vikings",
    "the Silk Road", "the Renaissance", "castles in Japan", "the Great Wall of China", "maps of the world",
    "languages", "grammar", "dictionaries", "newspapers", "radio", "television", "movies", "theater",
    "dance", "drawing", "sculpture", "architecture", "gardens", "parks", "farming", "tractors", "cheese",
    "rice", "apples", "honey", "spices", "baking cookies", "pizza", "sushi", "breakfast", "picnics",
    "sailing", "kayaking", "skiing", "tennis", "basketball", "marathons", "volunteering", "neighbors",
    "family traditions", "grandparents", "pets", "aquariums", "zoos", "circuses", "magic tricks",
    "handwriting", "letters", "stamps", "coins", "banks", "shopping", "advertising", "small businesses",
    "startups", "negotiation", "habits", "motivation", "curiosity", "patience", "creativity", "humor",
    "empathy", "decision making", "critical thinking", "note taking", "homework", "exams", "universities",
    "scholarships", "careers in science", "open source software", "the command line", "web browsers",
    "search engines", "cloud computing", "batteries", "light bulbs", "engines", "elevators", "bicycle repair",
    "traffic lights", "roads", "tunnels", "ships", "submarines", "canals",
]


# A third prompt set (``prompt_set="c"``): the shapes people actually ask in (how do I..., why
# does..., write a <form> about <scene>, compare, describe), each with its own object list, so
# the wording around the topic varies too. No held-out topic or wording (tested).
HOW_TEMPLATES = [
    "How do I {x}?", "What's the easiest way to {x}?", "Give me some tips to {x}.",
    "I want to {x}. Any advice?", "Explain the steps to {x}.", "What do I need to {x}?",
    "What mistakes should I avoid when I {x}?", "Can you teach me how to {x}?",
]
HOW_TASKS = [
    "fix a flat bicycle tire", "cook rice on the stove", "write a good resume", "learn to juggle",
    "start a vegetable garden", "train a puppy to sit", "clean a cast iron pan", "plan a birthday party",
    "save for a vacation", "prepare for a marathon", "make new friends in a new city", "improve my handwriting",
    "bake banana bread", "organize a messy closet", "write a short story", "learn to play the guitar",
    "speak more confidently", "choose a good book", "sleep better at night", "keep a journal",
    "make a paper airplane", "brew a good cup of coffee", "remember names", "set up a fish tank",
    "paint a room", "change a light bulb safely", "pack for a camping trip", "write a polite complaint",
    "learn multiplication tables", "draw a cat", "make pancakes", "tie a tie", "sew on a button",
    "build a birdhouse", "start running", "read faster", "learn to swim as an adult", "make a budget",
    "give a toast at a wedding", "care for a succulent", "make homemade pizza dough", "fold a fitted sheet",
    "clean my keyboard", "back up my photos", "learn a new word every day", "stop procrastinating",
    "make a smoothie", "calm down before a test", "write a haiku", "plan a road trip",
    "teach a child to ride a bike", "make my own greeting cards", "grow tomatoes on a balcony",
    "prepare for a job interview", "start a book club", "learn chess openings", "make friends with a shy cat",
    "write a cover letter", "reduce food waste at home", "get better at math",
    "wake up earlier", "make iced tea", "clean windows without streaks", "learn basic sign language",
    "write a limerick", "prepare a picnic", "teach my parrot a word", "walk a dog that pulls",
    "make a kite", "stay warm while camping", "choose running shoes", "keep bread fresh longer",
    "make a study schedule", "learn to knit", "remove a coffee stain", "host a board game night",
    "take better photos with my phone", "make friends at work", "build a snowman that lasts",
    "cook an omelette", "learn to whistle", "follow up after a job interview",
    "plan a surprise for my sister", "keep my desk tidy", "decorate a small apartment",
    "make a scarecrow", "start learning to code", "grow herbs in the kitchen", "make lemonade",
    "stretch after a run", "start saving for retirement", "memorize a poem", "make a family tree",
    "pick a ripe watermelon", "repair a wobbly chair", "write a song", "prepare for a long flight",
    "keep a conversation going", "say no politely", "make soap bubbles that last", "read a map",
]
WHY_TEMPLATES = ["Why do {x}?", "How come {x}?", "Explain why {x}.", "Is it true that {x}? Why?"]
WHY_FACTS = [
    "cats purr", "bread dough rise", "ice cubes float in water", "leaves change color",
    "onions make people cry", "birds fly south", "we yawn", "stars twinkle", "popcorn pop",
    "bubbles look round", "magnets stick to the fridge", "our ears pop on airplanes", "dogs wag their tails",
    "fish need water to breathe", "metal feel cold to the touch", "people get hiccups", "zebras have stripes",
    "owls hunt at night", "soap clean our hands", "mirrors reverse left and right", "we need to sleep",
    "bees make honey", "the ocean taste salty", "our fingers wrinkle in the bath", "snowflakes have six sides",
    "giraffes have long necks", "some people snore", "apples turn brown after cutting",
    "boats float even though they are heavy", "chameleons change color", "thunder come after lightning",
    "bats hang upside down", "we get goosebumps", "plants lean toward the window", "milk go sour",
    "cars have wheels that are round", "the moon change shape", "rivers flow to the sea", "people blush",
    "peppers taste spicy", "bread go stale", "sand feel hot at the beach", "we see our breath in winter",
    "cut grass smell so strong", "kangaroos hop", "bananas turn brown", "wool keep us warm",
    "camels have humps", "ducks stay dry in the rain", "our voices sound different on recordings",
    "spiders build webs", "clocks go clockwise", "candles melt", "music give us chills",
    "puddles disappear after rain", "some birds cannot fly", "babies sleep so much",
]
WRITE_FORMS = [
    "a short poem", "a short story", "a song verse", "a postcard message", "a birthday message",
    "a bedtime story", "a diary entry", "a short letter", "a fable with a moral", "a four-line rhyme",
]
WRITE_SCENES = [
    "a dragon who loves baking", "a rainy afternoon in a small town", "a robot learning to paint",
    "the first day of summer", "a snowman who wants to see the sea", "a busy train station at dawn",
    "a grandmother's kitchen", "a fox and a crow sharing lunch", "a lost umbrella", "a quiet library",
    "a street market at night", "an astronaut missing home", "a boy who collects stones",
    "a bakery that opens at midnight", "two old friends meeting again", "a sunflower in a city",
    "a turtle who wants to be fast", "the last day of school", "a mountain village in winter",
    "a squirrel preparing for winter", "a message in a time capsule", "a bus driver's long day",
    "a kite that escapes", "the smell of fresh bread", "a cat who thinks it is a king", "a harbor at sunset",
    "a child's first snowfall", "an old bicycle", "a forest after a storm", "a clock that runs backwards",
    "a penguin who wants to fly", "the night before a big trip", "a garden in spring", "a violin in an attic",
]
COMPARE_TEMPLATES = ["What is the difference between {a} and {b}?", "Which is better, {a} or {b}, and why?",
                     "Compare {a} and {b} in a few sentences."]
COMPARE_PAIRS = [
    ("a lake", "a pond"), ("weather", "climate"), ("a frog", "a toad"), ("a crocodile", "an alligator"),
    ("baking", "roasting"), ("a city", "a town"), ("a poem", "a song"), ("tea", "coffee"), ("a map", "a globe"),
    ("a novel", "a short story"), ("walking", "cycling"), ("a laptop", "a tablet"), ("renting", "buying a home"),
    ("a hobby", "a job"), ("a moth", "a butterfly"), ("speed", "velocity"), ("a hill", "a mountain"),
    ("a dolphin", "a shark"), ("jam", "jelly"), ("a violin", "a cello"), ("a wish", "a goal"),
    ("e-books", "paper books"), ("a rabbit", "a hare"), ("fog", "mist"), ("a comet", "an asteroid"),
    ("weight", "mass"), ("a sprint", "a marathon"), ("a museum", "a gallery"), ("a cafe", "a restaurant"),
    ("a bus", "a tram"),
]
DESCRIBE_TEMPLATES = ["Describe {x}.", "What is it like to visit {x}?", "Paint a picture in words of {x}."]
DESCRIBE_PLACES = [
    "a busy airport", "a quiet beach in winter", "the inside of a beehive", "a medieval castle", "a coral reef",
    "a farmers' market", "a desert at night", "the planet Mars", "a bamboo forest", "an old train station",
    "a science museum", "a small fishing village", "the top of a mountain", "a rainforest canopy", "a bakery",
    "a toy shop", "an ice hotel", "a volcano island", "a city park in autumn", "a submarine",
    "a space station", "a vineyard", "a night market", "a frozen lake", "a sunflower field",
]


def _third_set() -> list[str]:
    return ([tpl.format(x=x) for tpl in HOW_TEMPLATES for x in HOW_TASKS]
            + [tpl.format(x=x) for tpl in WHY_TEMPLATES for x in WHY_FACTS]
            + [f"Write {form} about {scene}." for form in WRITE_FORMS for scene in WRITE_SCENES]
            + [tpl.format(a=a, b=b) for tpl in COMPARE_TEMPLATES for a, b in COMPARE_PAIRS]
            + [tpl.format(x=x) for tpl in DESCRIBE_TEMPLATES for x in DESCRIBE_PLACES])


def prompt_pairs(prompt_set: str) -> list[str]:
    """Every template x topic prompt of one set, in a fixed order."""
    if prompt_set == "a":
        return [tpl.format(t=topic) for tpl in TEMPLATES for topic in TOPICS]
    if prompt_set == "b":
        return ([tpl.format(t=topic) for tpl in MORE_TEMPLATES for topic in TOPICS + MORE_TOPICS]
                + [tpl.format(t=topic) for tpl in TEMPLATES for topic in MORE_TOPICS])
    if prompt_set == "c":
        return _third_set()
    raise ValueError(f"prompt_set = {prompt_set!r}: unknown; use 'a' (the first set), 'b' (the second) "
                     "or 'c' (the third)")


def training_prompts(num: int, seed: int = 0, prompt_set: str = "a") -> list[str]:
    """``num`` distinct prompts of one set, shuffled (never one of ``HELDOUT``)."""
    pairs = prompt_pairs(prompt_set)
    rng = random.Random(seed)
    rng.shuffle(pairs)
    held = set(HELDOUT)
    return [p for p in pairs if p not in held][:num]
