#include "special_split.h"

#include <cctype>
#include <iterator>
#include <list>
#include <string_view>

namespace meshnet {

bool literal_ranges_valid(const std::vector<text_range> & ranges, size_t size) {
    size_t after = 0;
    for (const text_range & range : ranges) {
        if (range.begin < after || range.begin >= range.end || range.end > size) {
            return false;
        }
        after = range.end;
    }
    return true;
}

namespace {

bool overlaps_literal(size_t begin, size_t end, const std::vector<text_range> & literal) {
    for (const text_range & range : literal) {
        if (range.begin < end && begin < range.end) {
            return true;
        }
    }
    return false;
}

// The first place in [from, end) where `special` may be split out, or npos.
size_t find_allowed(std::string_view text, size_t from, size_t end, const special_token & special,
                    const std::vector<text_range> & literal) {
    const std::string_view area = text.substr(0, end);
    for (size_t at = area.find(special.text, from); at != std::string_view::npos; at = area.find(special.text, at + 1)) {
        if (!special.control || !overlaps_literal(at, at + special.text.size(), literal)) {
            return at;
        }
    }
    return std::string_view::npos;
}

} // namespace

std::vector<text_piece> split_specials(const std::string & text, const std::vector<special_token> & specials,
                                       const std::vector<text_range> & literal) {
    std::list<text_piece> pieces;
    if (!text.empty()) {
        pieces.push_back({-1, 0, text.size()});
    }
    // As llama.cpp: each special in turn, each raw piece left to right, every match in it.
    for (const special_token & special : specials) {
        if (special.text.empty()) {
            continue;
        }
        for (auto it = pieces.begin(); it != pieces.end(); ++it) {
            if (it->token >= 0) {
                continue;
            }
            size_t begin = it->begin;
            const size_t end = it->end;
            for (;;) {
                const size_t match = find_allowed(text, begin, end, special, literal);
                if (match == std::string_view::npos) {
                    break;
                }
                size_t left_end = match;
                if (special.lstrip) {
                    while (left_end > begin && std::isspace(static_cast<unsigned char>(text[left_end - 1]))) --left_end;
                }
                if (left_end > begin) {
                    pieces.insert(it, {-1, begin, left_end});
                }
                pieces.insert(it, {special.id, 0, 0});
                begin = match + special.text.size();
                if (special.rstrip) {
                    while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
                }
            }
            if (begin >= end) {
                it = std::prev(pieces.erase(it));
            } else {
                it->begin = begin;
            }
        }
    }
    return {pieces.begin(), pieces.end()};
}

} // namespace meshnet
