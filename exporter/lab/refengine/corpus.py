"""The text the reference tokenizer learns its byte-level BPE merges from at start-up.

Written for this project (no third-party text): short passages on ordinary subjects, so the
merges cover common English words, numbers and punctuation, plus a few paragraphs in the
vocabulary of serving language models. Any input still tokenizes: the alphabet is all 256
bytes.
"""

from __future__ import annotations

PASSAGES: tuple[str, ...] = (
    """The lighthouse on the northern cape was built in 1871 from granite cut two valleys
away. For ninety years a keeper climbed its one hundred and twelve steps every evening,
trimmed the wick, wound the clockwork that turned the lens, and wrote the weather into a
ledger: wind from the west, force six, visibility four miles, rain after midnight. The ledgers
still sit in a cupboard in the village school. Children read them aloud on the first day of
winter, and the oldest pages smell of salt and lamp oil.""",
    """To bake a plain loaf, mix five hundred grams of flour with ten grams of salt, seven
grams of yeast and about three hundred and fifty millilitres of warm water. Knead the dough
for ten minutes, until it is smooth and springs back when pressed. Leave it covered in a warm
place for an hour, shape it, let it rise again for forty minutes, then bake it at two hundred
and twenty degrees for half an hour. The loaf is done when the bottom sounds hollow.""",
    """The river starts as a trickle between two stones on the moor, cold enough to make
your teeth ache. By the time it reaches the town it is wide and brown and slow, carrying
leaves, branches and once, according to the local paper, a wooden rowing boat with nobody in
it. In summer the water drops and a gravel bank appears near the old mill, where herons stand
for hours without moving, waiting for a fish to make a mistake.""",
    """Our train left the station at seven minutes past six. The carriage was nearly empty:
a man with a bicycle, two students asleep against each other, a woman knitting something
long and green. Outside, the fields were grey and then gold as the sun came up behind the
hills. At the third stop a conductor walked through, checked every ticket twice, and told us
the buffet car would open at eight, which it did not.""",
    """In the workshop every tool has a place drawn on the wall in black paint: the outline
of a hammer, three chisels from narrow to wide, a hand saw, a square, a pair of pliers. When
something is missing you see the empty shape at once. The rule is simple. Use it, clean it,
put it back. The bench is oak, scarred by forty years of work, and the vice at its end has
been repaired so often that hardly any of the original iron is left.""",
    """A market opens on the square every Saturday. By half past eight the stalls are up:
apples and pears from the orchards in the south, cheese in heavy wheels, fresh eggs in
cardboard trays, honey, flowers, second hand books, knives sharpened while you wait. Prices
are written in chalk. People argue about the weather, about football, about whether the
bakery on the corner has changed its recipe. Nobody is ever in a hurry.""",
    """Mountains make their own weather. A clear morning at the hut can turn into cloud and
hail by noon, so walkers are told to start early, to carry a map and a compass as well as a
phone, to pack a warm layer even in August, and to turn back when the path disappears. The
summit will still be there next year. Most accidents happen on the way down, when people are
tired and the light is going.""",
    """Numbers appear everywhere in daily life: 3 eggs, 12 months, 24 hours, 60 minutes,
100 metres, 365 days, 1024 bytes, 2048 tokens, 0.5 seconds, 99.9 percent, 7 days a week.
Phone numbers, postcodes, dates like 2024-05-17 and times like 14:30 all need to be read
correctly. A good tokenizer splits them into pieces that a model can learn from, and a poor
one turns a simple date into a dozen fragments.""",
    """Serving a language model is a pipeline. A request arrives over the network, waits in
a queue, is tokenized on the CPU, copied to the GPU, processed in one prefill pass over the
whole prompt, and then decoded one token at a time. Each new token is detokenized, filtered
and streamed back to the client. When the GPU sits idle while requests wait, the bottleneck
is usually somewhere on the CPU side: the tokenizer, the scheduler, the event loop, or the
interrupts that handle network traffic.""",
    """Continuous batching lets requests join and leave the running batch at every decode
step. A new request does not wait for the whole batch to finish; it is admitted as soon as
there is room in the key and value cache, and a finished request frees its blocks at once.
The scheduler decides, step by step, which requests run, which wait, and which are preempted
when memory runs short. Throughput rises with the batch size until the memory bandwidth of
the accelerator is saturated.""",
    """Prefill is compute bound: the prompt tokens are processed together and the matrix
multiplications keep the tensor cores busy. Decode is memory bound: every step reads all of
the weights and the whole key and value cache to produce a single token per request. That is
why the time per output token barely changes between one request and eight, and why a long
queue in front of an idle GPU is a warning sign rather than a sign of success.""",
    """The kitchen window looks over a small garden with a plum tree, a bench that needs
paint, and a row of herbs in pots: mint, thyme, rosemary, parsley and a basil plant that
never survives past September. In the morning the cat sits under the tree and watches the
birds with great interest and no real plan. In the evening the light turns orange and the
whole street smells of someone else's dinner.""",
    """When the power went out, the office became very quiet. The fans stopped, the screens
went dark, and for a moment everyone looked at each other as if someone had said something
rude. Then people found torches on their phones, somebody opened a window, and the
conversation turned to the old days of typewriters and carbon paper. The lights came back
after twenty minutes. Nobody admitted to enjoying the break, but everybody had.""",
    """Questions, answers and instructions come in many shapes. What is the capital of
France? Paris. How many legs does a spider have? Eight. Please summarise the following text
in three sentences. Translate this paragraph into plain English. Write a short poem about the
sea. List five ways to save energy at home: turn off lights, wash clothes at a lower
temperature, fix dripping taps, close curtains at night, and use a lid on the pan.""",
    """Good logs tell you what happened without making you guess. Each line carries a time,
a level, the component that wrote it and a message a person can read: "worker started",
"queue full, rejecting request", "connection closed by peer after 30 s". Too few logs and you
are blind; too many and the one line that matters is buried under a thousand that do not.
Metrics answer a different question: not what happened, but how much and how often.""",
    """The bus to the coast runs every hour in summer and twice a day in winter. It stops in
every village on the way, waits outside the post office for anyone who is late, and takes
the hairpin bends above the harbour slowly enough that you can see the boats below, bright
blue and red against the green water. The driver knows most passengers by name and all of
them by the stop where they get off.""",
)


def training_text() -> list[str]:
    """The passages with their line breaks folded, as training sequences for the BPE model."""
    return [" ".join(passage.split()) for passage in PASSAGES]
