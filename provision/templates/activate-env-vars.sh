# shellcheck shell=sh
# Installed by bin/provision as $CONDA_PREFIX/etc/conda/activate.d/zz-lingbot-env-vars.sh.
#
# Exports the variables listed in $CONDA_PREFIX/etc/lingbot/env-vars, the one source of truth that
# bin/envcheck and bin/train (provision/envvars.py) read too. Each previous value is kept in
# CONDA_BACKUP_LINGBOT_<NAME>, set only when <NAME> was set, so deactivation restores "unset" and
# "empty" exactly, like conda-forge's compiler scripts do with CONDA_BACKUP_<NAME>. The LINGBOT_ part
# matters: gcc_linux-64's own hook runs first and holds CONDA_BACKUP_CC; sharing it would lose the
# user's CC on deactivation.
#
# The zz- name makes conda run this after the compiler packages' hooks, so the absolute CC/CXX here win
# over anything the user had set (for example CC=/usr/bin/gcc on a login node). The file also holds what
# those packages' hooks set (captured by bin/provision): re-applying it here changes nothing (`default`
# keeps the value there, `prepend` does not repeat a value already in front).
# TRITON_CACHE_DIR is only exported, never created: Triton creates it on first use, and bin/envcheck
# reports a cache on a network filesystem.

_lingbot_vars="${CONDA_PREFIX}/etc/lingbot/env-vars"
if [ -r "${_lingbot_vars}" ]; then
  while read -r _lingbot_mode _lingbot_name _lingbot_value; do
    case "${_lingbot_mode}" in set | default | prepend) ;; *) continue ;; esac  # comments, blank lines
    case "${_lingbot_name}" in '' | [0-9]* | *[!A-Za-z0-9_]*) continue ;; esac
    _lingbot_isset=""
    eval "_lingbot_isset=\${${_lingbot_name}+x}"
    if [ "${_lingbot_isset}" = x ]; then
      eval "export CONDA_BACKUP_LINGBOT_${_lingbot_name}=\"\${${_lingbot_name}}\""
      eval "_lingbot_old=\"\${${_lingbot_name}}\""
    else
      unset "CONDA_BACKUP_LINGBOT_${_lingbot_name}"
      _lingbot_old=""
    fi
    # provision/envvars.py allows only ${NAME} references in values, so this eval only expands them
    eval "_lingbot_value=\"${_lingbot_value}\""
    if [ "${_lingbot_mode}" = default ] && [ -n "${_lingbot_old}" ]; then
      _lingbot_value="${_lingbot_old}"  # the user's own value (or a package hook's) stays
    elif [ "${_lingbot_mode}" = prepend ] && [ -n "${_lingbot_old}" ]; then
      case "${_lingbot_old}" in
        "${_lingbot_value}" | "${_lingbot_value}":*) _lingbot_value="${_lingbot_old}" ;;  # already in front
        *) _lingbot_value="${_lingbot_value}:${_lingbot_old}" ;;
      esac
    fi
    eval "export ${_lingbot_name}=\"\${_lingbot_value}\""
  done <"${_lingbot_vars}"
fi
unset _lingbot_vars _lingbot_mode _lingbot_name _lingbot_value _lingbot_isset _lingbot_old
