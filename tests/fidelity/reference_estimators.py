"""The Dr. MAS reference's advantage estimators, re-implemented in torch from their file:line for comparison.

Each function below transcribes one function of ``langfengQ/DrMAS`` (commit 19c632b) statement by statement, with
the same tensors, dict accumulators and loops, so the tests compare drmas against the reference's own arithmetic.
Only what cannot run here changed: ``DataProto`` arguments become the arrays they are read from, ``print`` calls
are dropped, and ``uuid4`` cluster labels become counters (labels only). The tests build the token tables in
float64 (the reference's are float32) so that agreement to 1e-6 tests the definitions, not float32 rounding. Files
cited: ``core_algos`` = ``verl/trainer/ppo/core_algos.py``, ``torch_functional`` = ``verl/utils/torch_functional.py``.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from difflib import SequenceMatcher

import numpy as np
import torch


# ---------------------------------------------------------------- torch_functional.py:136-187
def masked_mean(values, mask, axis=None):  # torch_functional:136-149
    return (values * mask).sum(axis=axis) / (mask.sum(axis=axis) + 1e-8)


def masked_var(values, mask, unbiased=True):  # torch_functional:152-167
    mean = masked_mean(values, mask)
    centered_values = values - mean
    variance = masked_mean(centered_values**2, mask)
    if unbiased:
        mask_sum = mask.sum()
        if mask_sum == 0:
            raise ValueError("At least one element in the mask has to be 1.")
        if mask_sum == 1:
            raise ValueError("The sum of the mask is one, which can cause a division by zero.")
        bessel_correction = mask_sum / (mask_sum - 1)
        variance = variance * bessel_correction
    return variance


def masked_whiten(values, mask, shift_mean=True):  # torch_functional:170-187
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


# ---------------------------------------------------------------- ray_trainer.py:269-274
def group_index(uid, agent_id, group_by_agent_id):
    if group_by_agent_id:
        return np.array([f"{u}_{a}" for u, a in zip(uid, agent_id, strict=True)], dtype=object)
    return np.asarray(uid, dtype=object)


# ---------------------------------------------------------------- core_algos.py:497-569
def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, traj_index, epsilon=1e-6,
                                   norm_adv_by_std_in_grpo=True, group_by_agent_id=False):  # fmt: skip
    scores = token_level_rewards.sum(dim=-1)
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    traj_accumulator, traj2avg = defaultdict(list), {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            traj_accumulator[(index[i], traj_index[i])].append(scores[i])
        for (idx, t_idx), reward_list in traj_accumulator.items():
            if group_by_agent_id:
                id2score[idx].extend(reward_list)
            else:
                avg_score = torch.stack(reward_list).mean()
                traj2avg[(idx, t_idx)] = avg_score
                id2score[idx].append(avg_score)
        if not group_by_agent_id:
            for i in range(bsz):
                scores[i] = traj2avg[(index[i], traj_index[i])]
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            elif len(id2score[idx]) > 1:
                scores_tensor = torch.stack(id2score[idx])
                id2mean[idx] = torch.mean(scores_tensor)
                id2std[idx] = torch.std(scores_tensor)
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        for i in range(bsz):
            if norm_adv_by_std_in_grpo:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1) * response_mask
    return scores, scores


# ---------------------------------------------------------------- core_algos.py:572-631
def compute_grpo_passk_outcome_advantage(token_level_rewards, response_mask, index, traj_index, epsilon=1e-6,
                                         norm_adv_by_std_in_grpo=True, group_by_agent_id=False):  # fmt: skip
    scores = token_level_rewards.sum(dim=-1)
    advantages = torch.zeros_like(scores)
    id2scores, id2indices, seen_pairs = defaultdict(list), defaultdict(list), set()
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            if (index[i], traj_index[i]) in seen_pairs:
                continue
            idx = index[i]
            id2scores[idx].append(scores[i])
            id2indices[idx].append(i)
            if not group_by_agent_id:
                seen_pairs.add((index[i], traj_index[i]))
        for idx in id2scores:
            rewards = torch.stack(id2scores[idx])
            if rewards.numel() < 2:
                raise ValueError(
                    f"Pass@k requires at least 2 samples per group. Got {rewards.numel()} for group {idx}."
                )
            topk, topk_idx = torch.topk(rewards, 2)
            r_max, r_second_max = topk[0], topk[1]
            i_max = id2indices[idx][topk_idx[0].item()]
            advantage = r_max - r_second_max
            if norm_adv_by_std_in_grpo:
                std = torch.std(rewards)
                advantage = advantage / (std + epsilon)
            advantages[i_max] = advantage
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


# ---------------------------------------------------------------- core_algos.py:634-677
def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards, response_mask, index, traj_index,
                                                           epsilon=1e-6, group_by_agent_id=False):  # fmt: skip
    response_length = token_level_rewards.shape[-1]
    scores = token_level_rewards.sum(dim=-1)
    id2score, id2mean, seen_pairs = defaultdict(list), {}, set()
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            if (index[i], traj_index[i]) in seen_pairs:
                continue
            id2score[index[i]].append(scores[i])
            if not group_by_agent_id:
                seen_pairs.add((index[i], traj_index[i]))
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
            elif len(id2score[idx]) > 1:
                id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        for i in range(bsz):
            scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1).tile([1, response_length]) * response_mask
        scores = masked_whiten(scores, response_mask) * response_mask
    return scores, scores


# ---------------------------------------------------------------- core_algos.py:680-721
def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index, traj_index, epsilon=1e-6,
                                   group_by_agent_id=False):  # fmt: skip
    scores = token_level_rewards.sum(dim=-1)
    id2score, id2mean, seen_pairs = defaultdict(list), {}, set()
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            if (index[i], traj_index[i]) in seen_pairs:
                continue
            id2score[index[i]].append(scores[i])
            if not group_by_agent_id:
                seen_pairs.add((index[i], traj_index[i]))
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
            elif len(id2score[idx]) > 1:
                id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        for i in range(bsz):
            response_num = len(id2score[index[i]])
            if response_num > 1:
                scores[i] = scores[i] * response_num / (response_num - 1) - id2mean[
                    index[i]
                ] * response_num / (response_num - 1)
        scores = scores.unsqueeze(-1) * response_mask
    return scores, scores


# ---------------------------------------------------------------- core_algos.py:724-754
def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, gamma):
    with torch.no_grad():
        returns = torch.zeros_like(token_level_rewards)
        running_return = 0
        for t in reversed(range(token_level_rewards.shape[1])):
            running_return = token_level_rewards[:, t] + gamma * running_return
            returns[:, t] = running_return
            running_return = running_return * response_mask[:, t]  # reset after EOS
        advantages = masked_whiten(returns, response_mask)
        advantages = advantages * response_mask
    return advantages, returns


# ---------------------------------------------------------------- core_algos.py:757-782
def compute_remax_outcome_advantage(token_level_rewards, reward_baselines, response_mask):
    with torch.no_grad():
        returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns


# ---------------------------------------------------------------- core_algos.py:75-88, 113-126 (GiGPO helpers)
def to_hashable(x):
    if isinstance(x, (int, float, str, bool)):
        return x
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    if isinstance(x, np.ndarray):
        return tuple(x.flatten())
    if isinstance(x, (list, tuple)):
        return tuple(to_hashable(e) for e in x)
    if isinstance(x, dict):
        return tuple(sorted((k, to_hashable(v)) for k, v in x.items()))
    raise TypeError(f"Unsupported type: {type(x)}")


def are_similar(a, b, threshold=0.95):
    if not isinstance(a, str) or not isinstance(b, str):
        raise ValueError(
            "Only text-based observations are supported for similarity-based GiGPO in this version."
        )
    return SequenceMatcher(None, a, b).ratio() >= threshold


# ---------------------------------------------------------------- core_algos.py:128-197 (DataProto -> arrays)
def compute_step_discounted_returns(rewards, traj_uids, active_masks, env_step, gamma):
    rewards = np.asarray(rewards).astype(np.float32)
    traj_uids = np.asarray(traj_uids, dtype=object)
    active_masks = np.asarray(active_masks).astype(np.float32)
    env_step = np.asarray(env_step).astype(np.int32)
    returns_by_traj = {}
    unique_traj_uids = np.unique(traj_uids)
    for uid in unique_traj_uids:
        traj_indices = np.where(traj_uids == uid)[0]
        traj_rewards = rewards[traj_indices]
        traj_active_masks = active_masks[traj_indices]
        traj_env_step = env_step[traj_indices]
        assert traj_active_masks.all(), "active_masks should be all 1s for the same trajectory"
        first_of_group = np.r_[True, traj_env_step[1:] != traj_env_step[:-1]]
        step_starts = np.flatnonzero(first_of_group)
        step_ends = np.r_[step_starts[1:], len(traj_env_step)]
        step_rewards = traj_rewards[step_starts].astype(np.float32)
        step_returns = np.zeros_like(step_rewards, dtype=np.float32)
        running_return = 0.0
        for k in reversed(range(len(step_rewards))):
            running_return = step_rewards[k] + gamma * running_return
            step_returns[k] = running_return
        traj_returns = np.zeros_like(traj_rewards, dtype=np.float32)
        for sr, s, e in zip(step_returns, step_starts, step_ends, strict=True):
            traj_returns[s:e] = sr
        returns_by_traj[uid] = (traj_indices, traj_returns)
    all_returns = np.zeros_like(rewards, dtype=np.float32)
    for uid in unique_traj_uids:
        traj_indices, traj_returns = returns_by_traj[uid]
        all_returns[traj_indices] = traj_returns
    return torch.tensor(all_returns, dtype=torch.float32)


# ---------------------------------------------------------------- core_algos.py:200-447 (GiGPO)
def compute_gigpo_outcome_advantage(token_level_rewards, step_rewards, response_mask, anchor_obs, index, traj_index,
                                    epsilon=1e-6, step_advantage_w=1.0, mode="mean_norm", enable_similarity=False,
                                    similarity_thresh=0.95, group_by_agent_id=False):  # fmt: skip
    if mode == "mean_std_norm":
        remove_std = False
    elif mode == "mean_norm":
        remove_std = True
    else:
        raise ValueError(f"Unknown mode: {mode}")
    episode_advantages = episode_norm_reward(token_level_rewards, response_mask, index, traj_index, epsilon,
                                             remove_std, group_by_agent_id)  # fmt: skip
    step_group_uids = build_step_group(anchor_obs, index, enable_similarity, similarity_thresh)
    step_advantages = step_norm_reward(step_rewards, response_mask, step_group_uids, epsilon, remove_std)
    scores = episode_advantages + step_advantage_w * step_advantages
    return scores, scores


def episode_norm_reward(token_level_rewards, response_mask, index, traj_index, epsilon=1e-6, remove_std=True,
                        group_by_agent_id=False):  # fmt: skip  # core_algos.py:237-303
    response_length = token_level_rewards.shape[-1]
    scores = token_level_rewards.sum(dim=-1)
    id2score, id2mean, id2std, seen_pairs = defaultdict(list), {}, {}, set()
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            if (index[i], traj_index[i]) in seen_pairs:
                continue
            id2score[index[i]].append(scores[i])
            if not group_by_agent_id:
                seen_pairs.add((index[i], traj_index[i]))
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            elif len(id2score[idx]) > 1:
                id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))
                id2std[idx] = torch.std(torch.tensor([id2score[idx]]))
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        for i in range(bsz):
            if remove_std:
                scores[i] = scores[i] - id2mean[index[i]]
            else:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
        episode_advantages = scores.unsqueeze(-1).tile([1, response_length]) * response_mask
    return episode_advantages


def build_step_group(
    anchor_obs, index, enable_similarity=False, similarity_thresh=0.95
):  # core_algos.py:306-394
    if enable_similarity:
        assert 0.0 < similarity_thresh < 1.0
    labels = itertools.count()  # the reference draws uuid4 labels
    anchor_obs, index = np.asarray(anchor_obs, dtype=object), np.asarray(index, dtype=object)
    step_group_uids = np.empty(len(anchor_obs), dtype=object)
    for idx in np.unique(index):
        if not enable_similarity:
            indices = np.where(index == idx)[0]
            obs_group = anchor_obs[indices]
            clusters = defaultdict(list)
            for i, obs in enumerate(obs_group):
                clusters[to_hashable(obs)].append(indices[i])
            for _obs, original_indices in clusters.items():
                uid = next(labels)
                for original_idx in original_indices:
                    step_group_uids[original_idx] = uid
        else:
            locs = np.where(index == idx)[0]
            obs_group = anchor_obs[locs]
            clusters = []
            for obs, loc in zip(obs_group, locs, strict=True):
                placed = False
                for cluster in clusters:
                    if are_similar(obs, cluster["rep"], similarity_thresh):
                        cluster["locs"].append(loc)
                        placed = True
                        break
                if not placed:
                    clusters.append({"rep": obs, "locs": [loc]})
            for cluster in clusters:
                uid = next(labels)
                for loc in cluster["locs"]:
                    step_group_uids[loc] = uid
    if None in step_group_uids or np.any(step_group_uids == None):  # noqa: E711 (the reference's test)
        raise ValueError("Failed to assign UIDs to all observations.")
    return step_group_uids


def step_norm_reward(
    step_rewards, response_mask, index, epsilon=1e-6, remove_std=True
):  # core_algos.py:397-447
    response_length = response_mask.shape[-1]
    scores = step_rewards.clone()
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))
                id2std[idx] = torch.tensor(1.0)
            elif len(id2score[idx]) > 1:
                id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))
                id2std[idx] = torch.std(torch.tensor([id2score[idx]]))
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        for i in range(bsz):
            if remove_std:
                scores[i] = scores[i] - id2mean[index[i]]
            else:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
        step_advantages = scores.unsqueeze(-1).tile([1, response_length]) * response_mask
    return step_advantages


# ---------------------------------------------------------------- token-level tables
def token_table(scores, lengths):
    """(token_level_rewards, response_mask), both (B, T) float64: each row's score at its last response token, as
    the reference's reward manager writes it (``agent_system/reward_manager/episode.py:82``)."""
    b, t = len(scores), int(max(lengths))
    rewards = torch.zeros((b, t), dtype=torch.float64)
    mask = torch.zeros((b, t), dtype=torch.float64)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        rewards[i, n - 1] = float(s)
        mask[i, :n] = 1.0
    return rewards, mask


def per_row(adv, mask):
    """(B,) numpy: each row's advantage, after checking it is the same on all of the row's response tokens."""
    a = adv.detach().double()
    first = a[:, 0]
    same = torch.where(mask > 0, a - first[:, None], torch.zeros_like(a)).abs().max()
    assert float(same) < 1e-9 or bool(torch.isnan(same)), "the reference advantage varies within a response"
    return first.numpy()
