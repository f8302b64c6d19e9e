"""The synthetic encyclopedia: a seeded, procedural, uncontaminated multi-hop QA benchmark with its own corpus.

A world of fictional people, cities and companies is drawn from a seed. Each entity has attributes (years,
occupation, country, industry, population) and relations to other entities (founder, headquarters,
birthplace, employer, mayor); each is rendered as one encyclopedia passage titled by its name. Questions:

* ``single`` (1 hop): one attribute/relation of a named entity ("In what year was Talia Voskar born?").
* ``bridge`` (``h`` hops): a chain of ``h - 1`` relations then a final attribute ("In which country is the
  birthplace of the founder of Voskar Dynamics?"); the supporting passages are the ``h`` entities on the chain.
* ``comparison`` (2 supporting passages): which of two entities has the earlier year / larger population.

Distractors: entities come in *families* of ``1 + distractors`` look-alikes that share a name stem ("Talia
Voskar", "Meren Voskar"; "Voskar Dynamics", "Voskar Holdings"; "Port Ambry", "Lake Ambry") but have independent
attributes, so lexical retrieval must discriminate. Names and values are random, so answers are findable only
by retrieving the passages. Everything derives from ``random.Random(seed)``: same config, same benchmark.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from typing import Any

from drmas_envs.core import ListTaskSource, Task
from drmas_envs.search.corpus import Passage

__all__ = ["EncyclopediaConfig", "Encyclopedia", "generate_encyclopedia", "DATA_SOURCE"]

DATA_SOURCE = "synthetic_encyclopedia"

_SYLLABLES = (
    "ka ra vo el mi ta ne su lo ber dan fe gor hal is jun kel lum mar nor "
    "os pel quin ros sil tor ul var wen yel zan bri cor dri fal gan hest ilm jor kav lisk mon "
    "nev orn prax quel rav sten thal ur vell wyn xan yor zel ash bel cal dor"
).split()
_OCCUPATIONS = ("cartographer", "violinist", "glassblower", "astronomer", "botanist", "architect", "chemist",
                "novelist", "sculptor", "engineer", "linguist", "mathematician", "physician", "photographer")
_INDUSTRIES = ("shipbuilding", "textiles", "aviation", "pharmaceuticals", "software", "mining", "publishing",
               "brewing", "robotics", "agriculture", "railways", "optics")
_COMPANY_SUFFIXES = ("Dynamics", "Holdings", "Works", "Industries", "Labs", "Group", "Foundry", "Systems")
_CITY_FORMS = ("Port {}", "Lake {}", "North {}", "Fort {}", "New {}", "East {}", "{} Falls", "{} Harbor")


@dataclasses.dataclass(frozen=True)
class EncyclopediaConfig:
    """Size and mix of a synthetic encyclopedia (all counts are exact; all choices seeded).

    Attributes:
        seed: the world and its questions derive only from this.
        num_people, num_cities, num_companies: entity counts (corpus size = their sum).
        num_questions: number of tasks.
        hops: hop counts questions are drawn from (uniformly); ``1`` = single-hop, ``>= 2`` = bridge.
        comparison_fraction: share of comparison questions (the rest follow ``hops``).
        distractors: look-alike entities per family (0 = all names unrelated).
        num_countries: size of the country name pool.
        question_seed: the questions derive from this seed (None = ``seed``); the world does not depend on it, so
            another ``question_seed`` asks other questions about the same passages (held-out validation). Task ids
            are ``synth-<seed>-<i>``, or ``synth-<seed>q<question_seed>-<i>`` when it is set.
    """

    seed: int = 0
    num_people: int = 240
    num_cities: int = 90
    num_companies: int = 120
    num_questions: int = 500
    hops: tuple[int, ...] = (1, 2, 3)
    comparison_fraction: float = 0.2
    distractors: int = 2
    num_countries: int = 12
    question_seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_people", "num_cities", "num_companies", "num_questions", "num_countries"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 2:
                raise ValueError(f"EncyclopediaConfig.{name} must be an int >= 2, got {getattr(self, name)!r}")
        if not self.hops or not all(isinstance(h, int) and 1 <= h <= 6 for h in self.hops):
            raise ValueError(f"EncyclopediaConfig.hops must be a non-empty tuple of ints in 1..6, got {self.hops!r}")
        if not 0.0 <= self.comparison_fraction <= 1.0:
            raise ValueError(f"comparison_fraction must be in [0, 1], got {self.comparison_fraction!r}")
        if not isinstance(self.distractors, int) or self.distractors < 0:
            raise ValueError(f"distractors must be an int >= 0, got {self.distractors!r}")
        qs = self.question_seed
        if qs is not None and (isinstance(qs, bool) or not isinstance(qs, int)):
            raise ValueError(f"EncyclopediaConfig.question_seed must be an int or None, got {qs!r}")
        object.__setattr__(self, "hops", tuple(self.hops))


@dataclasses.dataclass
class _Entity:
    kind: str  # "person" | "city" | "company"
    name: str
    attrs: dict[str, Any]
    rel: dict[str, int]  # relation -> index into Encyclopedia.entities


@dataclasses.dataclass(frozen=True)
class Encyclopedia:
    """A generated world: its passages (one per entity, title = name) and its questions as tasks."""

    config: EncyclopediaConfig
    passages: tuple[Passage, ...]
    tasks: ListTaskSource


# relation -> (from kind, to kind, noun phrase of the target with {x} the source)
_RELATIONS = {
    "founder": ("company", "person", "the founder of {x}"),
    "headquarters": ("company", "city", "the city where {x} is headquartered"),
    "birthplace": ("person", "city", "the birthplace of {x}"),
    "employer": ("person", "company", "the employer of {x}"),
    "mayor": ("city", "person", "the mayor of {x}"),
}
# final question per kind: (attribute or relation, question template)
_FINALS = {
    "person": [("birth_year", "In what year was {x} born?"), ("occupation", "What was the occupation of {x}?"),
               ("birthplace", "In which city was {x} born?"), ("employer", "Which company employed {x}?")],
    "city": [("country", "In which country is {x}?"), ("founded", "In what year was {x} founded?"),
             ("mayor", "Who is the mayor of {x}?")],
    "company": [("founded", "In what year was {x} founded?"), ("industry", "In which industry does {x} operate?"),
                ("founder", "Who founded {x}?"), ("headquarters", "In which city is {x} headquartered?")],
}
_COMPARISONS = {
    "person": ("birth_year", "Who was born earlier, {a} or {b}?", min),
    "company": ("founded", "Which company was founded earlier, {a} or {b}?", min),
    "city": ("population", "Which city has the larger population, {a} or {b}?", max),
}


def _word(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(lo, hi))).capitalize()


def _families(rng: random.Random, n: int, size: int, make_stem, make_member, used: set[str]) -> list[str]:
    names: list[str] = []
    while len(names) < n:
        stem = make_stem()
        members: list[str] = []
        for _ in range(200):
            if len(members) == min(size, n - len(names)):
                break
            name = make_member(stem)
            if name not in used and name not in members:
                members.append(name)
        if len(members) == min(size, n - len(names)):
            used.update(members)
            names.extend(members)
    return names


def _build_world(cfg: EncyclopediaConfig, rng: random.Random) -> list[_Entity]:
    size = 1 + cfg.distractors
    used: set[str] = set()
    countries = sorted({_word(rng, 2, 3) + rng.choice(("ia", "land", "mark", "stan", "or")) for _ in range(cfg.num_countries * 3)})
    countries = rng.sample(countries, min(cfg.num_countries, len(countries)))
    people = _families(rng, cfg.num_people, size, lambda: _word(rng, 2, 3), lambda s: f"{_word(rng, 2, 2)} {s}", used)
    cities = _families(rng, cfg.num_cities, size, lambda: _word(rng, 2, 3), lambda s: rng.choice(_CITY_FORMS).format(s), used)
    companies = _families(rng, cfg.num_companies, size, lambda: _word(rng, 2, 3),
                          lambda s: f"{s} {rng.choice(_COMPANY_SUFFIXES)}", used)
    ents: list[_Entity] = []
    p0, c0, k0 = 0, len(people), len(people) + len(cities)
    for name in people:
        ents.append(_Entity("person", name, {"birth_year": rng.randint(1850, 1990), "occupation": rng.choice(_OCCUPATIONS)}, {}))
    for name in cities:
        ents.append(_Entity("city", name, {"country": rng.choice(countries), "founded": rng.randint(1100, 1900),
                                           "population": rng.randint(5_000, 3_000_000)}, {}))
    for name in companies:
        ents.append(_Entity("company", name, {"founded": rng.randint(1870, 2015), "industry": rng.choice(_INDUSTRIES)}, {}))
    pick = {"person": lambda: p0 + rng.randrange(len(people)), "city": lambda: c0 + rng.randrange(len(cities)),
            "company": lambda: k0 + rng.randrange(len(companies))}
    for e in ents:
        for rel, (src, dst, _) in _RELATIONS.items():
            if e.kind == src:
                e.rel[rel] = pick[dst]()
    return ents


def _render(e: _Entity, ents: list[_Entity], rng: random.Random) -> str:
    a, r = e.attrs, {k: ents[v].name for k, v in e.rel.items()}
    if e.kind == "person":
        article = "an" if a["occupation"][0] in "aeiou" else "a"
        s = [f"{e.name} was {article} {a['occupation']} born in {a['birth_year']} in {r['birthplace']}.",
             f"For most of their career, {e.name} worked for {r['employer']}.",
             f"Colleagues described {e.name.split()[0]} as {rng.choice(('meticulous', 'patient', 'restless', 'generous'))}."]
    elif e.kind == "city":
        s = [f"{e.name} is a city in {a['country']}, founded in {a['founded']}.",
             f"It has a population of {a['population']:,}.",
             f"The current mayor of {e.name} is {r['mayor']}."]
    else:
        article = "an" if a["industry"][0] in "aeiou" else "a"
        s = [f"{e.name} is {article} {a['industry']} company founded in {a['founded']} by {r['founder']}.",
             f"Its headquarters are in {r['headquarters']}.",
             f"{e.name} is known locally for its {rng.choice(('annual fair', 'apprenticeships', 'archives', 'museum'))}."]
    head, tail = s[0], s[1:]
    rng.shuffle(tail)
    return " ".join([head, *tail])


def _answer(e: _Entity, key: str, ents: list[_Entity]) -> str:
    return ents[e.rel[key]].name if key in e.rel else str(e.attrs[key])


def _question(cfg: EncyclopediaConfig, rng: random.Random, ents: list[_Entity], i: int) -> Task:
    if rng.random() < cfg.comparison_fraction:
        kind = rng.choice(sorted(_COMPARISONS))
        attr, template, better = _COMPARISONS[kind]
        pool = [j for j, e in enumerate(ents) if e.kind == kind]
        while True:
            ja, jb = rng.sample(pool, 2)
            va, vb = ents[ja].attrs[attr], ents[jb].attrs[attr]
            if va != vb:
                break
        winner = ents[ja] if better(va, vb) == va else ents[jb]
        chain, qtype, hops = [ja, jb], "comparison", 2
        question, answer = template.format(a=ents[ja].name, b=ents[jb].name), winner.name
    else:
        hops = rng.choice(cfg.hops)
        while True:  # a chain of `hops` distinct entities (no cycles), so every hop needs a new passage
            j = rng.randrange(len(ents))
            chain, phrase = [j], ents[j].name
            for _ in range(hops - 1):
                options = sorted(k for k, (src, _, _) in _RELATIONS.items()
                                 if src == ents[chain[-1]].kind and ents[chain[-1]].rel[k] not in chain)
                if not options:
                    break
                rel = rng.choice(options)
                phrase = _RELATIONS[rel][2].format(x=phrase)
                chain.append(ents[chain[-1]].rel[rel])
            finals = [(k, t) for k, t in _FINALS[ents[chain[-1]].kind] if ents[chain[-1]].rel.get(k) not in chain]
            if len(chain) == hops and finals:
                break
        key, template = rng.choice(finals)
        answer = _answer(ents[chain[-1]], key, ents)
        question = template.format(x=phrase)
        question = question[0].upper() + question[1:]
        qtype = "single" if hops == 1 else "bridge"
    titles = list(dict.fromkeys(ents[j].name for j in chain))
    prefix = f"synth-{cfg.seed}" if cfg.question_seed is None else f"synth-{cfg.seed}q{cfg.question_seed}"
    return Task(f"{prefix}-{i}", DATA_SOURCE, question, (answer,),
                {"type": qtype, "hops": hops, "supporting_titles": titles})


@functools.lru_cache(maxsize=8)
def generate_encyclopedia(config: EncyclopediaConfig | None = None) -> Encyclopedia:
    """Generate (once per process per config; cached) the world's passages and questions.

    Passage ids are ``"e<index>"``; titles are the unique entity names. Tasks carry
    ``extra = {"type": "single"|"bridge"|"comparison", "hops": int, "supporting_titles": [...]}``.
    """
    cfg = config or EncyclopediaConfig()
    rng = random.Random(cfg.seed)
    ents = _build_world(cfg, rng)
    passages = tuple(Passage(f"e{j}", e.name, _render(e, ents, rng)) for j, e in enumerate(ents))
    qrng = random.Random(f"{cfg.seed if cfg.question_seed is None else cfg.question_seed}-questions")
    tasks = [_question(cfg, qrng, ents, i) for i in range(cfg.num_questions)]
    return Encyclopedia(cfg, passages, ListTaskSource(tasks, name=DATA_SOURCE))
